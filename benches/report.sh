#!/usr/bin/env bash
# The figures of the README's "Performance" section from one run: the workload table (41
# interleaved rounds; vt against the migrating mode, vt with unpinned carriers, tokio, rayon and
# the bare coroutine loop; W7), the floor (W1 and W5 on one carrier and on all, beside
# corosensei's bare loops), then wrk against the HTTP servers (benches/wrk.sh, with the
# carriers' pinning forced both ways beside the default). About 3 minutes on 2 cores; run it on a
# quiet machine. One command from the repository root: `bash benches/report.sh`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
echo "benches/report.sh: $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
WORKLOADS_ROUNDS=${WORKLOADS_ROUNDS:-41} WORKLOADS_RUNTIMES=${WORKLOADS_RUNTIMES:-migrate,unpinned,tokio,rayon,bare} \
    WORKLOADS_PARTS=table,w7 cargo bench --bench workloads
WORKLOADS_ROUNDS=${WORKLOADS_ROUNDS:-41} WORKLOADS_PARTS=floor cargo bench --bench workloads
ROUNDS=${ROUNDS:-3} DURATION=${DURATION:-5s} VT_PIN_MODES=${VT_PIN_MODES:-1 0} bash benches/wrk.sh
echo "benches/report.sh: done $(date -u '+%H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
