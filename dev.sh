#!/usr/bin/env bash
# One-stop developer entry: sets everything up on first use, then runs a task.
#   ./dev.sh demo    post-train the embedded tiny SANA (see README: GPU vs CPU path)
#   ./dev.sh test    run the test suite
#   ./dev.sh setup   only install (venv in .venv, system packages when root)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${COSMOS_SANA_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
SYSTEM_PACKAGES=(redis-server tesseract-ocr tesseract-ocr-eng shellcheck)

log() { printf '[dev.sh] %s\n' "$*" >&2; }

install_system_packages() {
  local missing=()
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v tesseract >/dev/null || missing+=(tesseract-ocr tesseract-ocr-eng)
  command -v shellcheck >/dev/null || missing+=(shellcheck)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    log "installing system packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    log "missing system packages: ${missing[*]} (install them: sudo apt-get install ${SYSTEM_PACKAGES[*]})"
    return 1
  fi
}

install_python() {
  local stamp="$VENV/.cosmos-sana-installed"
  if [ -f "$stamp" ] && [ "$stamp" -nt "$ROOT/pyproject.toml" ]; then
    return 0
  fi
  [ -x "$PY" ] || python3 -m venv "$VENV"
  log "installing cosmos-sana and its pinned dependencies into $VENV (first time: several minutes)"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -e "${ROOT}[test]"
  touch "$stamp"
}

setup() {
  install_system_packages
  install_python
}

case "${1:-}" in
  setup) setup ;;
  demo) shift; setup; exec "$VENV/bin/cosmos-sana" demo "$@" ;;
  test) shift; setup; cd "$ROOT"; exec "$PY" -m pytest -q "$@" ;;
  *) echo "usage: ./dev.sh {demo|test|setup} [args...]" >&2; exit 2 ;;
esac
