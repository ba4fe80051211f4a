#!/usr/bin/env bash
# A stand-in for nvidia-cuda-mps-control (GREENCTL_MPS_CONTROL points at a copy of it).
# It records every call in $FAKE_MPS_LOG with the environment it got, and behaves like the
# real program enough for greenctl's MPS session:
#   -d           starts a "daemon" (a sleep) and, unless FAKE_MPS_NO_SERVER is set, a
#                "server" (another sleep), opens $CUDA_MPS_PIPE_DIRECTORY/control (a FIFO),
#                writes the daemon's pid file and a control.log in $CUDA_MPS_LOG_DIRECTORY
#   stdin quit   kills both and removes the control pipe (FAKE_MPS_IGNORE_QUIT: does nothing)
#   stdin get_server_list   prints the server's pid (none without a server)
# Without a control pipe every command fails as the real client does.
log="${FAKE_MPS_LOG:?FAKE_MPS_LOG is not set}"
pipe="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
if [ "${1:-}" = "-d" ]; then
  echo "start pipe=$pipe logdir=${CUDA_MPS_LOG_DIRECTORY:-} cvd=${CUDA_VISIBLE_DEVICES:-} pct=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-}" >> "$log"
  if [ -n "${FAKE_MPS_FAIL_START:-}" ]; then
    echo "An instance of this daemon is already running" >&2
    exit 1
  fi
  if [ ! -d "$pipe" ] || [ ! -d "${CUDA_MPS_LOG_DIRECTORY:-/nonexistent}" ]; then
    echo "pipe or log directory missing" >&2
    exit 1
  fi
  mkfifo "$pipe/control"
  sleep 300 </dev/null >/dev/null 2>&1 &
  echo $! > "$pipe/nvidia-cuda-mps-control.pid"
  if [ -z "${FAKE_MPS_NO_SERVER:-}" ]; then
    sleep 300 </dev/null >/dev/null 2>&1 &
    echo $! > "$pipe/server.pid"
  fi
  echo "[2026-01-01 00:00:00.000 Control 1] Starting control daemon using socket $pipe/control" \
    > "$CUDA_MPS_LOG_DIRECTORY/control.log"
  exit 0
fi
read -r cmd
echo "cmd=$cmd pipe=$pipe" >> "$log"
if [ ! -p "$pipe/control" ]; then
  echo "Cannot find MPS control daemon process" >&2
  exit 1
fi
case "$cmd" in
  get_server_list)
    [ -f "$pipe/server.pid" ] && cat "$pipe/server.pid"
    ;;
  get_default_active_thread_percentage)
    echo "${FAKE_MPS_DEFAULT_PCT:-100.0}"
    ;;
  quit)
    if [ -z "${FAKE_MPS_IGNORE_QUIT:-}" ]; then
      for f in nvidia-cuda-mps-control.pid server.pid; do
        [ -f "$pipe/$f" ] && kill "$(cat "$pipe/$f")" 2>/dev/null
      done
      rm -f "$pipe/control"
    fi
    ;;
esac
exit 0
