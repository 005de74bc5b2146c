#!/usr/bin/env bash
# wrk, a real client in a process of its own, against the HTTP/1.1 server on vt::net
# (benches/examples/http_server.rs) and its tokio twin (http_server_tokio.rs, the same HTTP
# code). For each concurrency and round, the servers in an order rotated each round: start one
# on a free loopback port, wait until it accepts, run
# `wrk -t$WRK_THREADS -c$c -d$DURATION --latency`, read the server's CPU time (utime + stime from
# /proc/PID/stat) before and after, stop it. Then a table of medians over the rounds and the
# vt/tokio ratios. One command from the repository root: `bash benches/wrk.sh`.
#
# Settings (environment): ROUNDS (default 3), DURATION (wrk's -d, default 10s), CONNS
# (default "100 1000"), WRK_THREADS (wrk's -t, default 1: one client thread caps req/s at
# 1 / its CPU per request, `arch/performance.md`), VT_ARGS / TOKIO_ARGS (extra flags for each
# server, e.g. VT_ARGS="--carriers 2"), VT_BIN (another build of http_server, to compare two
# builds of the runtime against the same tokio), VT_PIN_MODES (e.g. "1 0": one more vt server
# per mode, named vt-pin1 / vt-pin0, run with VT_PIN_CARRIERS set to it, beside the default
# `vt`, whose carriers are pinned until their CPU is shared), VT_STD=1 (one more server,
# vt-std: the same server on std::net's own types, `--std`, built with the `hooks` feature that
# parks them; arch/hooks.md), VT_ACCEPT (how the vt servers accept: `one`, the default, one
# listener and acceptor; `per-carrier`, a listener and acceptor per carrier on the port,
# `--accept per-carrier`, arch/decisions/0015-acceptor-per-carrier.md; `both`, one more server,
# vt-pc, run with `--accept per-carrier` beside `vt`).
# Installs wrk with apt-get if it is missing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
WRK_THREADS=${WRK_THREADS:-1}
case $WRK_THREADS in
    '' | *[!0-9]* | 0) echo "wrk.sh: WRK_THREADS takes a positive number of threads, got '$WRK_THREADS'" >&2; exit 2 ;;
esac
CONNS=${CONNS:-100 1000}
VT_ARGS=${VT_ARGS:-}
TOKIO_ARGS=${TOKIO_ARGS:-}
VT_PIN_MODES=${VT_PIN_MODES:-}
VT_STD=${VT_STD:-}
VT_ACCEPT=${VT_ACCEPT:-one}
SERVERS=(vt tokio)
[ -z "$VT_STD" ] || SERVERS+=(vt-std)
case $VT_ACCEPT in
    one) ACCEPT_ARGS= ;;
    per-carrier) ACCEPT_ARGS="--accept per-carrier" ;;
    both) ACCEPT_ARGS= && SERVERS+=(vt-pc) ;;
    *) echo "wrk.sh: VT_ACCEPT takes one, per-carrier or both, got '$VT_ACCEPT'" >&2; exit 2 ;;
esac
for mode in $VT_PIN_MODES; do
    case $mode in
        0 | 1) SERVERS+=("vt-pin$mode") ;;
        *) echo "wrk.sh: VT_PIN_MODES takes 0 and 1, got '$mode'" >&2; exit 2 ;;
    esac
done

if ! command -v wrk >/dev/null; then
    echo "wrk.sh: installing wrk (apt-get)" >&2
    apt-get install -y wrk >&2 || { apt-get update >&2 && apt-get install -y wrk >&2; }
fi

bin_dir="${CARGO_TARGET_DIR:-target}/release/examples"
tick=$(getconf CLK_TCK)
work=$(mktemp -d)
if [ -n "$VT_STD" ]; then
    # The feature changes the build's one http_server binary: build it first and keep a copy.
    echo "wrk.sh: building the std::net server (release, --features hooks)" >&2
    cargo build --release -p vt-bench --features hooks --example http_server >&2
    cp "$bin_dir/http_server" "$work/http_server_hooks"
fi
echo "wrk.sh: building both servers (release)" >&2
cargo build --release -p vt-bench --example http_server --example http_server_tokio >&2
VT_BIN=${VT_BIN:-$bin_dir/http_server}
server_pid=

stop_server() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$server_pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    server_pid=
}
trap 'stop_server; rm -rf "$work"' EXIT

# The server's utime + stime, in clock ticks. The fields after the command name (which ends
# at the last ')') start with field 3, the state; utime and stime are fields 14 and 15.
cpu_ticks() {
    local stat
    stat=$(<"/proc/$1/stat")
    read -r -a f <<<"${stat##*) }"
    echo $((f[11] + f[12]))
}

# Starts server $1 on port 0 (the OS picks a free one) and sets `server_pid` and `port`.
start_server() {
    local name=$1 log="$work/server.out"
    local -a cmd
    case $name in
        vt) read -r -a cmd <<<"env VT_PIN_CARRIERS= $VT_BIN --port 0 $ACCEPT_ARGS $VT_ARGS" ;;
        vt-pc) read -r -a cmd <<<"env VT_PIN_CARRIERS= $VT_BIN --port 0 --accept per-carrier $VT_ARGS" ;;
        vt-pin*) read -r -a cmd <<<"env VT_PIN_CARRIERS=${name#vt-pin} $VT_BIN --port 0 $ACCEPT_ARGS $VT_ARGS" ;;
        vt-std) read -r -a cmd <<<"env VT_PIN_CARRIERS= $work/http_server_hooks --std --port 0 $VT_ARGS" ;;
        tokio) read -r -a cmd <<<"$bin_dir/http_server_tokio --port 0 $TOKIO_ARGS" ;;
    esac
    : >"$log"
    "${cmd[@]}" >"$log" 2>&1 &
    server_pid=$!
    port=
    for _ in $(seq 100); do
        port=$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$log")
        [ -n "$port" ] && break
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    if [ -z "$port" ]; then
        echo "wrk.sh: $name did not start:" >&2
        cat "$log" >&2
        exit 1
    fi
    # Listening is printed after bind; make sure a connection is accepted too.
    for _ in $(seq 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return
        fi
        sleep 0.1
    done
    echo "wrk.sh: $name does not accept on 127.0.0.1:$port" >&2
    exit 1
}

# wrk's latency in milliseconds, from "5.00ms", "812.00us" or "1.20s".
to_ms() {
    awk -v v="$1" 'BEGIN {
        if (v ~ /us$/) { sub(/us$/, "", v); print v / 1000 }
        else if (v ~ /ms$/) { sub(/ms$/, "", v); print v + 0 }
        else if (v ~ /s$/) { sub(/s$/, "", v); print v * 1000 }
        else { print "nan" } }'
}

results="$work/results"
: >"$results"
printf '%-8s %5s %5s %10s %9s %12s  %s\n' server c round req/s p99_ms cpu_us/req loadavg >&2
for c in $CONNS; do
    for round in $(seq "$ROUNDS"); do
        for k in $(seq 0 $((${#SERVERS[@]} - 1))); do
            name=${SERVERS[$(((k + round - 1) % ${#SERVERS[@]}))]}
            start_server "$name"
            before=$(cpu_ticks "$server_pid")
            out=$(wrk -t"$WRK_THREADS" -c"$c" -d"$DURATION" --latency "http://127.0.0.1:$port/")
            after=$(cpu_ticks "$server_pid")
            load=$(cut -d' ' -f1-3 /proc/loadavg)
            stop_server
            rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
            requests=$(awk '/ requests in / { print $1 }' <<<"$out")
            p99=$(to_ms "$(awk '$1 == "99%" { print $2 }' <<<"$out")")
            errors=$(awk '/Socket errors|Non-2xx/ { print }' <<<"$out")
            [ -z "$errors" ] || echo "wrk.sh: $name c=$c: $errors" >&2
            cpu_us=$(awk -v t=$((after - before)) -v hz="$tick" -v n="$requests" \
                'BEGIN { printf "%.2f", (n > 0 ? t / hz * 1e6 / n : 0) }')
            printf '%-8s %5s %5s %10.0f %9.2f %12s  %s\n' "$name" "$c" "$round" "$rps" "$p99" "$cpu_us" "$load" >&2
            echo "$name $c $rps $p99 $cpu_us" >>"$results"
        done
    done
done

# Medians per server and c, then the ratios.
echo
echo "wrk -t$WRK_THREADS -c{$CONNS} -d$DURATION --latency, $ROUNDS rounds, medians; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
awk '
    function median(list,    a, n, i, j, t) {
        n = split(list, a, " ")
        for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function ratio(a, b) { return b > 0 ? sprintf("%.2f", a / b) : "-" }
    { k = $1 " " $2; rps[k] = rps[k] " " $3; p99[k] = p99[k] " " $4; cpu[k] = cpu[k] " " $5
      if (!($2 in seen)) { seen[$2] = 1; cs[++nc] = $2 }
      if (!($1 in named)) { named[$1] = 1; ss[++ns] = $1 } }
    END {
        printf "| server | c | req/s | p99 | server CPU per request |\n|---|---|---|---|---|\n"
        for (i = 1; i <= nc; i++) for (s = 1; s <= ns; s++) {
            k = ss[s] " " cs[i]
            R[k] = median(rps[k]); P[k] = median(p99[k]); C[k] = median(cpu[k])
            printf "| %s | %s | %.0f | %.2f ms | %.1f µs |\n", ss[s], cs[i], R[k], P[k], C[k]
        }
        printf "\n| server | c | /tokio req/s | /tokio CPU per request | /tokio p99 |\n|---|---|---|---|---|\n"
        for (s = 1; s <= ns; s++) for (i = 1; i <= nc; i++) {
            if (ss[s] == "tokio") continue
            v = ss[s] " " cs[i]; t = "tokio " cs[i]
            printf "| %s | %s | %s | %s | %s |\n", ss[s], cs[i], ratio(R[v], R[t]), ratio(C[v], C[t]), ratio(P[v], P[t])
        }
    }' "$results"
