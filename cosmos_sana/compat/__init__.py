"""Everything that depends on cosmos-rl internals or works around its defects.

``autoload``  : stdlib-only start-up hook for the bare ``cosmos-rl --config`` form.
``cosmos_rl`` : registry glue, worker entry, and each upstream-defect workaround.

Tests in ``tests/test_compat_upstream.py`` pin every internal relied on here, so an
upstream change fails loudly instead of silently.
"""
