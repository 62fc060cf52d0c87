#!/usr/bin/env bash
# Fuzzes the journal's annotation decoder and command parser for a bounded time each.
#
#   journal/fuzz/run.sh [SECONDS_PER_TARGET]      (default 60; `make fuzz` calls this)
#
# Installs cargo-fuzz into the tool cache on first use (outside the checkout), builds with the
# nightly toolchain, keeps the growing corpus and the build in the cache too, and starts each
# target from the committed seeds in journal/fuzz/seeds/<target>. Crash inputs are written to
# journal/fuzz/artifacts/<target>/ (ignored by git). Exits non-zero if any target crashed.
set -euo pipefail

seconds="${1:-60}"
case "$seconds" in
  ''|*[!0-9]*) echo "usage: $0 [SECONDS_PER_TARGET]" >&2; exit 2 ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/celld-operator"
tools="$cache/tools"
export PATH="$tools/bin:$PATH"

if ! rustup toolchain list | grep -q '^nightly'; then
  echo "fuzzing needs a nightly toolchain: rustup toolchain install nightly" >&2
  exit 1
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "installing cargo-fuzz into $tools" >&2
  cargo install cargo-fuzz --locked --root "$tools"
fi

status=0
summary=""
for target in decode_document parse_command; do
  corpus="$cache/fuzz-corpus/$target"
  mkdir -p "$corpus" "$here/artifacts/$target"
  log="$(mktemp)"
  stamp="$(mktemp)"
  echo "== fuzzing $target for ${seconds}s" >&2
  set +e
  (cd "$here" && cargo +nightly fuzz run --target-dir "$cache/fuzz-target" "$target" \
      "$corpus" "$here/seeds/$target" -- \
      -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048) \
    2>&1 | tee "$log" >&2
  rc=${PIPESTATUS[0]}
  set -e
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
  crashes="$(find "$here/artifacts/$target" -type f -newer "$stamp" \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)"
  rm -f "$log" "$stamp"
  summary+="$target: ${execs:-?} executions, $crashes crash artifacts, exit $rc"$'\n'
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then status=1; fi
done
printf '%s' "$summary"
exit "$status"
