# Sourced by the H200 scripts: conformance_pair OUT PREFIX [extra cuda-main args...]
# runs the CUDA conformance suite against the float64 reference (n <= 16k) in bf16 and f16 as two
# processes side by side (the host reference is the slow part), into OUT/PREFIX-{bf16,f16}, and
# prints their summaries and any failures. Each takes ~160-190 s on the H200 (75 cases since
# session 20's lifetime case; session 21's f16 process was killed at 190 s one case short).
conformance_pair() {
  local out=$1 prefix=$2
  shift 2
  timeout -s KILL 250 node .device/app/cuda-main.mjs --phase conformance --dtypes bf16 --confMaxN 16384 \
    --budget 240 "$@" --out "$out/$prefix-bf16" > "$out/$prefix-bf16.log" 2>&1 &
  local pid=$!
  sleep 10
  timeout -s KILL 240 node .device/app/cuda-main.mjs --phase conformance --dtypes f16 --confMaxN 16384 \
    --budget 230 "$@" --out "$out/$prefix-f16" > "$out/$prefix-f16.log" 2>&1
  # that process only: a bare `wait` also waits for a caller's process substitution (a tee)
  wait "$pid"
  grep -h "conformance cuda:" "$out/$prefix"-*.log
  grep -h FAIL "$out/$prefix"-*.log | head -n 10
}
