#!/usr/bin/env bash
# The demo behind `make demo`: local stack up, the example model responses run, a cancel
# mid-batch, stack down. Set DEMO_KEEP=1 to leave the stack running (its Flower URL is printed then),
# FLOWER_PORT=N when 5555 is taken.
set -euo pipefail
cd "$(dirname "$0")/.."
TF=${TF:-.venv/bin/toolfleet}
export TOOLFLEET_HOME=${TOOLFLEET_HOME:-$PWD/.toolfleet}
CASES=examples/cases/openai_chat

$TF up -d --workers 2 --flower-port "${FLOWER_PORT:-5555}"
[ "${DEMO_KEEP:-0}" = 1 ] || trap '$TF down' EXIT

ws=$(mktemp -d)/workspace
cp -r examples/cases/workspace "$ws"
echo "workspace copy: $ws"

for case in 01_parallel_reads 02_read_write_order 03_bad_calls 04_slow_commands; do
  echo; echo "== $case"
  if [ "$case" = 04_slow_commands ]; then echo "(commands that sleep up to 20 s: the results come when they end)"; fi
  $TF run "$CASES/$case.json" --workspace "$ws"
done

for case in openai_responses/06_parallel_reads.json anthropic/07_mixed.json \
            openai_chat_stream/08_parallel_reads.jsonl anthropic_stream/09_two_reads.jsonl; do
  echo; echo "== $case"
  $TF run "examples/cases/$case" --workspace "$ws"
done

echo; echo "== 05_duplicate_ids (the batch is refused, nothing runs)"
$TF run "$CASES/05_duplicate_ids.json" --workspace "$ws" || true

echo; echo "== 04_slow_commands again, cancelled 2.5 s in"
$TF run "$CASES/04_slow_commands.json" --workspace "$ws" --cancel-after 2.5

flower=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('flower_url',''))" "$TOOLFLEET_HOME/stack.json")
echo
if [ "${DEMO_KEEP:-0}" = 1 ]; then
  echo "Flower: $flower/tasks  (API: $flower/api/tasks)"
  echo "stack left running; stop it with: TOOLFLEET_HOME=$TOOLFLEET_HOME $TF down"
else
  # the stack (Flower with it) stops as this script exits: no URL that would not answer
  echo "the stack stops now; run with DEMO_KEEP=1 to keep it (and look at the calls in Flower)"
fi
