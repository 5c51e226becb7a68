#!/usr/bin/env bash
# Install a cosmos-sana wheelhouse (made by `cosmos-sana wheelhouse`) on an air-gapped node.
#
#   launchers/install_offline.sh DIR [SITE]      then:  source SITE/env.sh
#
# Installs only from DIR (pip --no-index --no-deps --target SITE), links or unpacks the
# carried programs (redis-server, tesseract) under SITE/tools, writes SITE/env.sh (SITE first
# on PYTHONPATH so the bundled transformers/hub shadow the image's; SITE/bin and
# SITE/tools/bin on PATH) and checks imports, versions and programs. DIR is only read.
# Env: PYTHON (default: python, else python3), CHECK_IMPORTS (default below).
set -euo pipefail

die() { echo "install_offline: $*" >&2; exit 1; }

[[ $# -ge 1 && $# -le 2 ]] || die "usage: $0 DIR [SITE]"
[[ -f "$1/MANIFEST.json" ]] || die "$1 has no MANIFEST.json: build it with 'cosmos-sana wheelhouse --out $1'"
DIR=$(cd -- "$1" && pwd)
SITE=${2:-${XDG_DATA_HOME:-$HOME/.local/share}/cosmos-sana/site}
PY=${PYTHON:-$(command -v python || command -v python3 || true)}
[[ -n "$PY" ]] || die "no python on PATH (set PYTHON)"
CHECK_IMPORTS=${CHECK_IMPORTS:-cosmos_rl diffusers cosmos_sana}

want=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["python_version"])' "$DIR/MANIFEST.json")
have=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ "$want" == "$have" ]] || die "wheelhouse is for Python $want, $PY is $have (rebuild with --python-version $have)"

rm -rf "$SITE/tools"
mkdir -p "$SITE/tools/bin"
SITE=$(cd -- "$SITE" && pwd)
shopt -s nullglob
wheels=("$DIR"/*.whl)
[[ ${#wheels[@]} -gt 0 ]] || die "no wheels in $DIR"
echo "installing ${#wheels[@]} wheels into $SITE ..."
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --disable-pip-version-check --root-user-action=ignore --target "$SITE" "${wheels[@]}" || die "pip install failed"

# Programs: unpack <tool>.tar.xz or link <tool>/ into SITE/tools; wrappers find ../<tool>.
for archive in "$DIR"/*.tar.xz; do
    "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
        "$archive" "$SITE/tools" || die "cannot unpack $archive"
done
tools=$("$PY" - "$DIR/MANIFEST.json" <<'EOF'
import json, platform, sys

have = platform.libc_ver()[1]
tools = json.load(open(sys.argv[1]))["tools"]
for name, tool in tools.items():
    need = tool.get("min_glibc", "")
    if need and have and tuple(map(int, need.split("."))) > tuple(map(int, have.split(".")[:2])):
        sys.exit(f"{name} needs glibc >= {need}; this node has {have} (build the wheelhouse without it)")
print(" ".join(tools))
EOF
) || die "the carried programs do not fit this node"
for tool in $tools; do
    [[ -d "$DIR/$tool" ]] && ln -sfn "$DIR/$tool" "$SITE/tools/$tool"
    [[ -d "$SITE/tools/$tool" ]] || die "$tool is in the manifest but neither $DIR/$tool nor $DIR/$tool.tar.xz exists"
done
[[ -d "$DIR/bin" ]] && cp -f "$DIR"/bin/* "$SITE/tools/bin/"

# PYTHONPATH entries are not site dirs, so their .pth files (cosmos-sana's autoload hook)
# would be ignored: process them here, then run the interpreter's own sitecustomize, if any.
cat >"$SITE/sitecustomize.py" <<'EOF'
"""Written by cosmos-sana's install_offline.sh: run the .pth files of this folder."""
import importlib.machinery
import importlib.util
import os
import site
import sys

_here = os.path.dirname(os.path.abspath(__file__))
site.addsitedir(_here)
_rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
EOF

cat >"$SITE/env.sh" <<EOF
# Source me: cosmos-sana offline install from $DIR
export PYTHONPATH="$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
export PATH="$SITE/bin:$SITE/tools/bin\${PATH:+:\$PATH}"
EOF

# shellcheck source=/dev/null
source "$SITE/env.sh"
echo "checking imports: $CHECK_IMPORTS ..."
"$PY" - "$DIR/MANIFEST.json" "$CHECK_IMPORTS" <<'EOF' || die "import check failed (see above)"
import importlib, importlib.metadata as md, json, sys

manifest = json.load(open(sys.argv[1]))
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
wrong = [f"{w['name']} {version(w['name'])} (bundled {w['version']})"
         for w in manifest["wheels"] if version(w["name"]) != w["version"]]
if wrong:
    sys.exit("not the bundled version (is SITE first on PYTHONPATH?): " + ", ".join(wrong))
lacking = [n for n in manifest.get("node_requirements", []) if version(n) is None]
if lacking:
    print("warning: the node lacks " + ", ".join(lacking), file=sys.stderr)
for module in sys.argv[2].split():
    importlib.import_module(module)
print(f"ok: {len(manifest['wheels'])} bundled packages at their versions; imported {sys.argv[2]}")
EOF

command -v redis-server >/dev/null || die "no redis-server: rebuild the wheelhouse with --with-redis"
redis-server --version || die "redis-server does not run (missing system library? see docs/offline_install.md)"
if [[ -x "$SITE/tools/bin/tesseract" ]]; then
    version=$(tesseract --version 2>&1) || die "tesseract does not run (see docs/offline_install.md)"
    echo "${version%%$'\n'*}"
fi
echo "installed. Now: source $SITE/env.sh"
