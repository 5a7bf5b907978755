#!/usr/bin/env bash
# A multi-node Ray cluster on this machine: a head and N workers, for trying raysoft's cluster
# paths without a cloud. Token authentication stays on.
#   cluster_configs/local.sh start [N_WORKERS=2] [CPUS_PER_NODE=1]
#   cluster_configs/local.sh stop
#   RAY_ADDRESS=127.0.0.1:6390 raysoft run jobs/fedsoft_synthetic.yaml   (or --address 127.0.0.1:6390)
#   python jobs/submit.py --address http://127.0.0.1:8265 -- raysoft run jobs/fedsoft_synthetic.yaml
#
# Checked here (tests/e2e/test_multinode.py, Linux): clusters started with this script run raysoft as a
# driver and as Ray Jobs; `stop` ends every process of its cluster (by the PIDs and the listening
# ports seen at start) and none of another cluster's; the dashboard listens on 127.0.0.1 only and
# the Ray Client server not at all. Not checked here: systems other than Linux (the script reads
# session ids with procps' ps; macOS also needs RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 for Ray's
# multi-node mode).
#
# What listens where. The dashboard (and its Jobs API) binds 127.0.0.1 only. Ray 2.60 gives a node
# started with `ray start` the machine's external address even when told --node-ip-address=127.0.0.1
# (only a single-node Ray may keep 127.0.0.1, and then workers and drivers cannot join it), so the
# node-level services listen on that address too: the GCS, raylets and workers' gRPC servers on
# every interface, the dashboard and runtime-env agents on the node address and 127.0.0.1, the
# metrics exporters on every interface. Token authentication guards the gRPC and HTTP APIs (not
# the metrics pages); keep the machine's firewall closed to them. The Ray Client server, which
# `ray start --head` always starts and which would listen on the external address, is ended
# right after the start (raysoft's local paths use 127.0.0.1:PORT and the dashboard, not ray://);
# RAYSOFT_RAY_CLIENT=1 keeps it, on RAYSOFT_CLIENT_PORT.
#
# Ports (environment): RAYSOFT_HEAD_PORT (6390), RAYSOFT_DASHBOARD_PORT (8265),
# RAYSOFT_CLIENT_PORT (Ray Client server, 10001; outside the workers' ports 10002-19999),
# RAYSOFT_AGENT_PORT (52400: the head's dashboard agent; worker i gets +i), RAYSOFT_RAY_TMP (Ray's
# temp dir, /tmp/raysoft-local-cluster; keep it short: Unix socket paths are limited to 107
# bytes). Several clusters can share the machine when these differ.
#
# How `stop` finds the cluster. `start` runs every `ray start` in a new session (setsid) and
# records the session id in $RAYSOFT_RAY_TMP/local-cluster.sid (and the PIDs it started with in
# local-cluster.pids). Every Ray process of the cluster stays in that session, even once its
# parent has died and it has been re-parented to init; the only ones that open a session of
# their own are job entrypoints, which are children of the cluster's job supervisors. `stop`
# ends the processes of that session and their descendants, and nothing else: not by name, not
# by command line, so other Ray instances on the machine (and processes that merely mention
# the temp dir) are left alone.
set -euo pipefail
VENV="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin"
RAY="${RAY:-$VENV/ray}"
PYTHON="${PYTHON:-$VENV/python}"
export PATH="$VENV:$PATH"  # jobs' entrypoints (python -m raysoft ..., raysoft ...) find this .venv
PORT="${RAYSOFT_HEAD_PORT:-6390}"
DASHBOARD_PORT="${RAYSOFT_DASHBOARD_PORT:-8265}"
CLIENT_PORT="${RAYSOFT_CLIENT_PORT:-10001}"
AGENT_PORT="${RAYSOFT_AGENT_PORT:-52400}"
TMP="${RAYSOFT_RAY_TMP:-/tmp/raysoft-local-cluster}"
GRACE="${RAYSOFT_STOP_GRACE:-5}"  # seconds between SIGTERM and SIGKILL
SID_FILE="$TMP/local-cluster.sid"
PID_FILE="$TMP/local-cluster.pids"
export RAY_AUTH_MODE=token

# The live (not zombie) processes of session $1 and all their descendants, one PID a line; never
# this script nor what it runs (its own ps and awk belong to the session while it starts it).
cluster_pids() {
  ps -e -o pid= -o ppid= -o sid= -o stat= | awk -v sid="$1" -v me="$$" '
    $4 !~ /^Z/ { parent[$1] = $2; if ($3 == sid) keep[$1] = 1 }
    END {
      mine[me] = 1
      do { grown = 0
           for (p in parent) {
             if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; grown = 1 }
             if (!(p in mine) && (parent[p] in mine)) { mine[p] = 1; grown = 1 }
           }
      } while (grown)
      for (p in keep) if (!(p in mine)) print p
    }'
}

# Ray reads its token from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token; a fresh
# machine has none, and then `ray start` refuses to start. Create one, readable by its owner only.
ensure_token() {
  if [ -n "${RAY_AUTH_TOKEN:-}" ] || [ -n "${RAY_AUTH_TOKEN_PATH:-}" ] || [ -s "$HOME/.ray/auth_token" ]; then
    return
  fi
  mkdir -p "$HOME/.ray"
  (umask 077 && "$PYTHON" -c 'import secrets; print(secrets.token_hex(32), end="")' > "$HOME/.ray/auth_token.new" \
    && mv "$HOME/.ray/auth_token.new" "$HOME/.ray/auth_token")
  echo "created a Ray authentication token in ~/.ray/auth_token (mode 0600)" >&2
}

stop_cluster() {
  [ -s "$SID_FILE" ] || { echo "no cluster recorded in $TMP"; return 0; }
  local sid pids left i
  sid="$(cat "$SID_FILE")"
  pids="$(cluster_pids "$sid")"
  left="$pids"
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for ((i = 0; i < GRACE * 4; i++)); do
      # the survivors among them, and any process the session started meanwhile
      left="$( (ps -e -o pid= -o stat= | awk -v want=" $(echo $pids) " '$2 !~ /^Z/ && index(want, " " $1 " ") {print $1}'
                cluster_pids "$sid") | sort -u)"
      [ -z "$left" ] && break
      pids="$left"
      sleep 0.25
    done
    if [ -n "$left" ]; then  # the dashboard and runtime-env agents, for one, ignore SIGTERM
      # shellcheck disable=SC2086
      kill -KILL $left 2>/dev/null || true
    fi
  fi
  rm -f "$SID_FILE" "$PID_FILE"
  echo "stopped"
}

case "${1:-}" in
  start)
    n="${2:-2}"; cpus="${3:-1}"
    if [ -z "${_RAYSOFT_LOCAL_SESSION:-}" ]; then
      mkdir -p "$TMP"
      if [ -s "$SID_FILE" ] && [ -n "$(cluster_pids "$(cat "$SID_FILE")")" ]; then
        echo "a cluster is already running under $TMP: $0 stop first" >&2; exit 1
      fi
      ensure_token
      # run the rest in a session of its own: every process of the cluster inherits it
      exec setsid --wait env _RAYSOFT_LOCAL_SESSION=1 bash "$0" "$@"
    fi
    sid="$(ps -o sid= -p $$ | tr -d ' ')"
    echo "$sid" > "$SID_FILE"
    trap 'echo "start failed; stopping what was started" >&2; stop_cluster >&2' ERR
    "$RAY" start --head --port="$PORT" --num-cpus="$cpus" \
      --include-dashboard=true --dashboard-host=127.0.0.1 --dashboard-port="$DASHBOARD_PORT" \
      --ray-client-server-port="$CLIENT_PORT" --dashboard-agent-listen-port="$AGENT_PORT" \
      --temp-dir="$TMP" --disable-usage-stats >/dev/null
    if [ "${RAYSOFT_RAY_CLIENT:-0}" != 1 ]; then
      client="$( (cluster_pids "$sid" | xargs -r ps -o pid= -o args= -p || true) | awk '/ray[.]util[.]client[.]server/ {print $1}')"
      if [ -n "$client" ]; then
        # shellcheck disable=SC2086
        kill -TERM $client
        for _ in 1 2 3 4 5 6 7 8 9 10; do
          # shellcheck disable=SC2086
          ps -o stat= -p $client 2>/dev/null | grep -qv '^Z' || break
          sleep 0.5
        done
        # shellcheck disable=SC2086
        kill -KILL $client 2>/dev/null || true
      fi
    fi
    for i in $(seq 1 "$n"); do
      "$RAY" start --address="127.0.0.1:$PORT" --num-cpus="$cpus" \
        --dashboard-agent-listen-port="$((AGENT_PORT + i))" --disable-usage-stats >/dev/null
    done
    cluster_pids "$sid" | sort -n > "$PID_FILE"
    echo "head 127.0.0.1:$PORT with $n workers; dashboard http://127.0.0.1:$DASHBOARD_PORT"
    ;;
  stop) stop_cluster ;;
  *) echo "usage: $0 start [N_WORKERS] [CPUS_PER_NODE] | stop" >&2; exit 2 ;;
esac
