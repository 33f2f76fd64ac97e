#!/usr/bin/env bash
# The Slurm scale-out test (issue 50; docs/scale-out.md): starts a one-node Slurm cluster as
# processes of this script (munged, slurmctld, slurmd; no systemd), runs the sbatch templates of
# scripts/slurm/ on it and checks:
#   (a) 4 `mia --shard` array tasks + the dependent merge equal one unsharded run (every file of
#       --out byte for byte but the command line, device line and elapsed time; the scores CSV
#       byte for byte);
#   (b) a many-runs audit (4 training tasks, each with the target in or out by its coin, a
#       scoring array started per task by `aftercorr`, then the audit job) equals the audit
#       computed in one process from the same scores, and each trial row is the target's score
#       of that run's model, as scoring it here gives it;
#   (c) shard 2 killed while running (scancel of one array index) and resubmitted leaves a part
#       set with each shard exactly once that merge accepts, equal to (a)'s unsharded run; the
#       merge that depended on the killed array never runs; a part from another submission with
#       another plan is refused (exit 2);
#   (d) a merge submitted while shard 2 is missing exits 2 naming `missing shard(s): 2/4`;
#   (e) every daemon it started is gone afterwards (checked by PID, also when a check fails);
#   (f) a sweep split into 4 grid slices and joined equals the unsharded sweep's CSV byte for byte.
#
#   tests/slurm/run.sh [DPAUDIT]        (default: target/release/dpaudit)
#
# Needs root and Debian's slurmctld, slurmd, slurm-client and munge, and procps (installed with
# apt-get when missing). Without them it prints loudly that it skipped, and why, and exits 0 — except under
# CI=true, where it fails instead. KEEP=1 keeps the temporary folder (logs, parts, reports).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
t_start=$SECONDS

skip() {
  if [ "${CI:-}" = true ]; then
    echo "tests/slurm/run.sh: FAILED: cannot run under CI=true: $*" >&2
    exit 1
  fi
  echo "!!! SKIPPED tests/slurm/run.sh (the Slurm scale-out test): $*" >&2
  echo "!!! nothing of scripts/slurm/ was tested; run it as root on Debian, or under CI=true" >&2
  exit 0
}
fail() {
  echo "tests/slurm/run.sh: FAILED: $*" >&2
  exit 1
}
ok() { echo "ok: $* (+$((SECONDS - t_start)) s)"; }

bin=${1:-$repo/target/release/dpaudit}
case "$bin" in /*) ;; *) bin=$repo/$bin ;; esac
[ -x "$bin" ] || skip "no dpaudit binary at $bin (cargo build --release first)"
[ "$(id -u)" -eq 0 ] || skip "not root (slurmd runs jobs as root here; apt-get installs the daemons)"
# pgrep and ps (procps) find and check the processes; slurm's packages do not pull them in.
need_pkgs=0
for p in munged slurmctld slurmd sbatch pgrep ps; do command -v "$p" >/dev/null 2>&1 || need_pkgs=1; done
if [ "$need_pkgs" = 1 ]; then
  command -v apt-get >/dev/null 2>&1 || skip "slurm/munge/procps are not installed and there is no apt-get"
  echo "installing slurmctld slurmd slurm-client munge procps with apt-get"
  t_apt=$SECONDS
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || skip "apt-get update failed"
  apt-get install -y -qq slurmctld slurmd slurm-client munge procps >/dev/null ||
    skip "apt-get install of slurmctld slurmd slurm-client munge procps failed"
  ok "installed in $((SECONDS - t_apt)) s"
fi
command -v python3 >/dev/null 2>&1 || skip "no python3 (tests/slurm/same_report.py compares the reports)"

D=$(mktemp -d "${TMPDIR:-/tmp}/dpaudit-slurm.XXXXXX")
chmod 700 "$D"
pids=()
# The processes of this cluster: the daemons started here, every process whose environment
# carries the mark they were started with (slurmstepd, which slurmd starts detached from itself),
# and all their descendants (the jobs).
mark=DPAUDIT_SLURM_TEST=$D
tree() {
  local pid
  for pid in "$@"; do echo "$pid" && tree $(pgrep -P "$pid"); done
}
ours() {
  local f roots=("${pids[@]}")
  for f in /proc/[0-9]*/environ; do
    grep -qzx "$mark" "$f" 2>/dev/null && f=${f#/proc/} && roots+=("${f%/environ}")
  done
  tree "${roots[@]}" | sort -un
}
# alive PID…: those still running (a zombie has ended).
alive() {
  local pid
  for pid in "$@"; do
    [ -r "/proc/$pid/stat" ] && [ "$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)" != Z ] && echo "$pid"
  done
}
stop_daemons() {
  local rc=$? all=() left=() jobs k
  set +e
  if [ ${#pids[@]} -gt 0 ]; then
    # Jobs still queued or running (a check failed) are cancelled while the daemons still run.
    jobs=$(squeue -h -o %i 2>/dev/null | sort -u)
    if [ -n "$jobs" ]; then
      echo "$(date +%T) cancelling the jobs still queued or running: $(echo $jobs)"
      scancel $jobs
      for _ in $(seq 1 50); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
    fi
    # slurmstepd reports a job's end to slurmd: let the jobs' processes end before the daemons.
    for _ in $(seq 1 50); do
      [ "$(ours | wc -l)" -le "$(tree "${pids[@]}" | wc -l)" ] && break
      sleep 0.2
    done
    all=($(ours))
    for ((k = ${#pids[@]} - 1; k >= 0; k--)); do kill "${pids[k]}" 2>/dev/null; done
    for pid in "${all[@]}"; do kill "$pid" 2>/dev/null; done
    for _ in $(seq 1 50); do
      left=($(alive "${all[@]}"))
      [ ${#left[@]} -eq 0 ] && break
      sleep 0.2
    done
    if [ ${#left[@]} -gt 0 ]; then
      echo "$(date +%T) still running after SIGTERM: ${left[*]}; sending SIGKILL" >&2
      kill -9 "${left[@]}" 2>/dev/null
      sleep 0.5
    fi
    # (e) Every process started here is gone, by PID; and none of this cluster is left.
    left=($(alive "${all[@]}" $(ours)))
    if [ ${#left[@]} -gt 0 ]; then
      echo "tests/slurm/run.sh: FAILED: still running: $(ps -o pid=,cmd= -p "${left[*]// /,}")" >&2
      rc=1
    else
      for pid in "${all[@]}"; do
        echo "$pid" >"$D/pid"
        if pgrep -F "$D/pid" >/dev/null; then
          echo "tests/slurm/run.sh: FAILED: pgrep still finds PID $pid" >&2
          rc=1
        fi
      done
      echo "(e) every process of the cluster is gone (pgrep by PID): daemons ${pids[*]}; with children and jobs: ${all[*]}"
    fi
  fi
  if [ "${KEEP:-0}" = 1 ] || [ "$rc" -ne 0 ]; then
    echo "logs and outputs kept in $D"
    [ "$rc" -ne 0 ] && tail -n 20 "$D"/log/*.log 2>/dev/null >&2
  else
    rm -rf "$D"
  fi
  echo "tests/slurm/run.sh: $([ "$rc" -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - t_start)) s"
  exit "$rc"
}
trap stop_daemons EXIT
trap '[[ $- == *e* ]] && echo "tests/slurm/run.sh: FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR
trap 'exit 1' INT TERM

# --- the cluster: one node, the machine's CPUs, no cgroups, everything in $D ---------------------
mkdir -p "$D"/{munge,state,spool,log,etc}
head -c 1024 /dev/urandom >"$D/munge/munge.key"
chmod 400 "$D/munge/munge.key"
read -r ctld_port slurmd_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
host=$(hostname -s)
cat >"$D/etc/slurm.conf" <<CONF
ClusterName=dpaudit-ci
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.socket
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
PlugStackConfig=$D/etc/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
KillWait=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=ci Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
: >"$D/etc/plugstack.conf"
export SLURM_CONF=$D/etc/slurm.conf

t_cluster=$SECONDS
env "$mark" munged --foreground --force --key-file="$D/munge/munge.key" --socket="$D/munge/munge.socket" \
  --pid-file="$D/munge/munged.pid" --log-file="$D/log/munged.log" --seed-file="$D/munge/seed" \
  >>"$D/log/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do [ -S "$D/munge/munge.socket" ] && break; sleep 0.1; done
[ -S "$D/munge/munge.socket" ] || fail "munged did not start ($D/log/munged.log)"
env "$mark" slurmctld -D -i >>"$D/log/slurmctld.out" 2>&1 &
pids+=($!)
env "$mark" slurmd -D >>"$D/log/slurmd.out" 2>&1 &
pids+=($!)
for _ in $(seq 1 150); do sinfo -h -o %T 2>/dev/null | grep -qx idle && break; sleep 0.2; done
sinfo -h -o %T 2>/dev/null | grep -qx idle || fail "the node did not come up idle (sinfo: $(sinfo 2>&1))"
ok "cluster up in $((SECONDS - t_cluster)) s: munged, slurmctld, slurmd = PIDs ${pids[*]}"

# --- helpers --------------------------------------------------------------------------------------
# wait_done JOB…: until no task of these jobs is pending or running (5 min at most).
wait_done() {
  local j
  for _ in $(seq 1 1500); do
    j=$(squeue -h -j "$(IFS=,; echo "$*")" -o %i 2>/dev/null || true)
    [ -z "$j" ] && return 0
    sleep 0.2
  done
  fail "jobs $* still queued after 5 min: $(squeue)"
}
# state JOB: JobState and ExitCode of a finished (non-array or one array task) job.
state() { scontrol -o show job "$1" | grep -o 'JobState=[A-Z_]* .*ExitCode=[0-9:]*' | sed 's/ .* / /'; }
# task_states ARRAYJOB: "index state exit" per task.
task_states() {
  scontrol -o show job "$1" | sed -n 's/.*ArrayTaskId=\([0-9]*\) .*JobState=\([A-Z_]*\) .*ExitCode=\([0-9:]*\).*/\1 \2 \3/p' | sort -n
}
submit() { sbatch --parsable --chdir="$D" "$@"; }

tpl=$repo/scripts/slurm
data=$repo/fixtures/data/digits.csv.gz
split=$repo/fixtures/splits/digits.toml
mia_args="--attack loss,pia --timesteps 10,50 --noise-draws 2 --bootstrap 50 --seed 7 --data $data --split $split"

# --- (a), (c), (d): sharded attack, a killed and resubmitted shard, an early merge ----------------
t_a=$SECONDS
A=$D/mia
mkdir -p "$A/logs"
# The first submission's shard 2 stalls (a wrapper around the binary) so it can be killed while
# it runs; the resubmission uses the binary itself.
cat >"$D/dpaudit-stall-shard-2" <<WRAP
#!/bin/bash
case " \$* " in *" --shard 2/4 "*) touch "$D/shard-2-started"; sleep 600 ;; esac
exec "$bin" "\$@"
WRAP
chmod +x "$D/dpaudit-stall-shard-2"
# The templates read their variables from the environment (sbatch's default --export=ALL; a
# value with commas cannot go through --export=NAME=value).
export CHECKPOINT=$repo/models/digits-mlp.toml SHARDS=4 OUT=$A MIA_ARGS=$mia_args
arr1=$(DPAUDIT=$D/dpaudit-stall-shard-2 submit --array=0-3 --output="$A/logs/%x-%A_%a.out" "$tpl/mia-shard.sbatch")
merge1=$(DPAUDIT=$bin submit --dependency=afterok:"$arr1" --output="$A/logs/%x-%j.out" "$tpl/mia-merge.sbatch")
for _ in $(seq 1 600); do
  n=$(find "$A/parts" -name 'mia-part-*-of-4.json' 2>/dev/null | wc -l || true)
  [ "$n" -ge 3 ] && [ -e "$D/shard-2-started" ] && break
  # Only shard 2 (stalled) left pending or running: the others ended (checked below).
  [ "$(squeue -h -j "$arr1" -t PENDING,RUNNING -o %i 2>/dev/null | wc -l || true)" -le 1 ] && [ -e "$D/shard-2-started" ] && break
  sleep 0.2
done
[ "$(task_states "$arr1" | awk '$1 == 2 { print $2 }')" = RUNNING ] || fail "shard 2 is not running: $(task_states "$arr1")"
ls "$A/parts"/mia-part-{0,1,3}-of-4.json >/dev/null || fail "shards 0, 1, 3 did not write their parts"

# (d) A merge submitted now, before shard 2 exists, exits 2 naming the missing shard.
early=$(DPAUDIT=$bin submit --output="$A/logs/%x-early-%j.out" "$tpl/mia-merge.sbatch")
wait_done "$early"
[ "$(state "$early")" = "JobState=FAILED ExitCode=2:0" ] || fail "early merge: $(state "$early"), want FAILED with exit 2"
grep -q "missing shard(s): 2/4" "$A/logs/dpaudit-merge-early-$early.out" ||
  fail "early merge log does not name shard 2/4: $(cat "$A/logs/dpaudit-merge-early-$early.out")"
ok "(d) a merge before shard 2 exists exits 2: $(grep -o 'missing shard.*' "$A/logs/dpaudit-merge-early-$early.out")"

# (c) Kill shard 2 while it runs; the dependent merge can never run; resubmit index 2 only.
scancel "${arr1}_2"
wait_done "$arr1"
task_states "$arr1" | grep -qx "2 CANCELLED 0:15" || fail "shard 2 not cancelled: $(task_states "$arr1")"
[ "$(task_states "$arr1" | grep -c ' COMPLETED 0:0$')" = 3 ] || fail "shards 0, 1, 3: $(task_states "$arr1")"
[ ! -e "$A/parts/mia-part-2-of-4.json" ] || fail "the killed shard left a part file"
for _ in $(seq 1 50); do
  squeue -h -j "$merge1" -o %r | grep -q DependencyNeverSatisfied && break
  sleep 0.2
done
squeue -h -j "$merge1" -o '%T %r' | grep -qx "PENDING DependencyNeverSatisfied" ||
  fail "the merge depending on the killed array: $(squeue -h -j "$merge1" -o '%T %r' 2>&1; state "$merge1")"
scancel "$merge1"
arr2=$(DPAUDIT=$bin submit --array=2 --output="$A/logs/%x-%A_%a.out" "$tpl/mia-shard.sbatch")
merge2=$(DPAUDIT=$bin MERGE_ARGS="--scores-out $A/merged-scores.csv" \
  submit --dependency=afterok:"$arr2" --output="$A/logs/%x-%j.out" "$tpl/mia-merge.sbatch")
wait_done "$arr2" "$merge2"
[ "$(state "$merge2")" = "JobState=COMPLETED ExitCode=0:0" ] || fail "merge after the resubmission: $(state "$merge2") ($(cat "$A/logs/dpaudit-merge-$merge2.out"))"
parts=$(cd "$A/parts" && ls)
[ "$parts" = "$(printf 'mia-part-%s-of-4.json\n' 0 1 2 3)" ] || fail "part folder: $parts"
ok "(c) shard 2 killed (CANCELLED), its merge never ran, index 2 resubmitted: 4 parts, each once, merged (exit 0)"

# (a) The merged report is the unsharded run's. The unsharded run runs in the jobs' working
# directory ($D): a report lists the card's data and split among its inputs only where the
# paths the card records (relative to the repository) resolve from the working directory.
one=$D/one
# shellcheck disable=SC2086
(cd "$D" && "$bin" mia --checkpoint "$repo/models/digits-mlp.toml" $mia_args --out "$one" --scores-out "$D/one-scores.csv" -q >/dev/null)
python3 "$repo/tests/slurm/same_report.py" "$A/report" "$one" || fail "(a) the merged report differs from the unsharded run"
cmp "$A/merged-scores.csv" "$D/one-scores.csv" || fail "(a) merged scores differ from the unsharded run's"
# The comparison can fail: another seed gives another report.
# shellcheck disable=SC2086
(cd "$D" && "$bin" mia --checkpoint "$repo/models/digits-mlp.toml" ${mia_args/--seed 7/--seed 8} --out "$D/seed8" -q >/dev/null)
if python3 "$repo/tests/slurm/same_report.py" "$A/report" "$D/seed8" 2>/dev/null; then
  fail "same_report.py does not tell a run with another seed apart"
fi
ok "(a) 4 shards on Slurm + merge = the unsharded run (reports and scores CSV)"

# (c) A part of another submission with another plan is refused by its hash.
B=$D/other
mkdir -p "$B/logs"
other=$(OUT=$B DPAUDIT=$bin MIA_ARGS=${mia_args/--seed 7/--seed 8} \
  submit --array=1 --output="$B/logs/%x-%A_%a.out" "$tpl/mia-shard.sbatch")
wait_done "$other"
set +e
msg=$("$bin" merge "$A"/parts/mia-part-{0,2,3}-of-4.json "$B/parts/mia-part-1-of-4.json" 2>&1 >/dev/null)
rc=$?
set -e
[ "$rc" = 2 ] && grep -q "another plan" <<<"$msg" || fail "a part of another submission: exit $rc: $msg"
ok "(c) a part from another submission (another seed) is refused: exit 2"
echo "    sharded attack: $((SECONDS - t_a)) s"

# --- (b) many-runs audit: train array → scoring array (aftercorr) → audit ---------------------------
t_b=$SECONDS
M=$D/runs
mkdir -p "$M/logs"
target=2
"$tpl/target-splits.sh" "$split" "$target" "$M"
# A balanced random assignment: two runs with the target, two without (a many-runs audit needs
# both kinds of trial; independent coins would give 4 of a kind one time in eight).
printf '1\n1\n0\n0\n' | shuf >"$M/inclusion"
export DPAUDIT=$bin OUT=$M TARGET=$target RUNS=4
train=$(INCLUSION=$M/inclusion TRAIN_ARGS="--data $data --dp --steps 30 --hidden 32 --depth 2" \
  submit --array=0-3 --output="$M/logs/%x-%A_%a.out" "$tpl/runs-train.sbatch")
score=$(SCORE_ARGS="--attack loss,pia --timesteps 10,50 --noise-draws 2 --bootstrap 50 --seed 7" \
  submit --array=0-3 --dependency=aftercorr:"$train" --output="$M/logs/%x-%A_%a.out" "$tpl/runs-score.sbatch")
audit=$(submit --dependency=afterok:"$score" --output="$M/logs/%x-%j.out" "$tpl/runs-audit.sbatch")
wait_done "$train" "$score" "$audit"
[ "$(task_states "$train" | grep -c ' COMPLETED 0:0$')" = 4 ] || fail "training array: $(task_states "$train")"
[ "$(task_states "$score" | grep -c ' COMPLETED 0:0$')" = 4 ] || fail "scoring array: $(task_states "$score")"
audit_state=$(state "$audit")
case "$audit_state" in
  "JobState=COMPLETED ExitCode=0:0") audit_rc=0 ;;
  "JobState=FAILED ExitCode=1:0") audit_rc=1 ;;
  *) fail "audit job: $audit_state ($(cat "$M/logs/dpaudit-audit-$audit.out"))" ;;
esac
# Each run trained with its own coin and fresh noise: the cards differ, the coin is the split's.
for i in 0 1 2 3; do
  coin=$(sed -n "$((i + 1))p" "$M/inclusion")
  want=$([ "$coin" = 1 ] && echo split-in.toml || echo split-out.toml)
  grep -q "^split = \".*$want\"" "$M/runs/$i/$i.toml" || fail "run $i (coin $coin) did not train on $want"
  grep -q 'os: drawn' "$M/runs/$i/mia.txt" || fail "run $i is seeded: $(grep -i randomness "$M/runs/$i/mia.txt")"
done
[ "$(sha256sum "$M"/runs/*/*.safetensors | cut -d' ' -f1 | sort -u | wc -l)" = 4 ] || fail "two runs trained the same weights"
# Each trial row is the target's score on that run's model, as scoring it here gives it, with
# member = the run's coin.
for i in 0 1 2 3; do
  # shellcheck disable=SC2086
  "$bin" mia --checkpoint "$M/runs/$i/$i.toml" --attack loss,pia --timesteps 10,50 --noise-draws 2 \
    --bootstrap 50 --seed 7 --scores-out "$D/here-$i.csv" -q >/dev/null
  here=$(awk -F, -v OFS=, -v id="$target" -v run="run-$i" '$1 == id { $1 = run; print }' "$D/here-$i.csv")
  [ "$here" = "$(cat "$M/trials/$i.csv")" ] || fail "trial $i differs from scoring run $i here"
  coin=$(sed -n "$((i + 1))p" "$M/inclusion")
  [ "$(cut -d, -f2 "$M/trials/$i.csv" | sort -u)" = "$coin" ] || fail "trial $i: member column is not the coin $coin"
done
# Without INCLUSION a training task draws its own coin (here outside Slurm, as plain bash).
OUT=$M SLURM_ARRAY_TASK_ID=9 TRAIN_ARGS="--data $data --steps 5 --hidden 8 --depth 1" bash "$tpl/runs-train.sbatch" >/dev/null 2>&1 ||
  fail "runs-train.sbatch without INCLUSION failed"
grep -q '^split = ".*split-\(in\|out\)\.toml"' "$M/runs/9/9.toml" || fail "run 9 trained on neither split"
rm -rf "$M/runs/9"
[ "$(wc -l <"$M/scores.csv")" = 17 ] || fail "scores.csv: $(wc -l <"$M/scores.csv") lines, want 1 + 4 runs × 4 (attack, t)"
set +e
(cd "$D" && "$bin" mia --scores "$M/scores.csv" --audit many-runs --checkpoint "$M/runs/0/0.toml" --out "$D/audit-here" -q >/dev/null)
here_rc=$?
set -e
[ "$here_rc" = "$audit_rc" ] || fail "(b) exit $audit_rc on Slurm, $here_rc in one process"
python3 "$repo/tests/slurm/same_report.py" "$M/report" "$D/audit-here" || fail "(b) the many-runs report differs"
grep -q '"many_runs": {' "$M/report/mia.json" || fail "(b) no many-runs audit in $M/report/mia.json"
ok "(b) many-runs audit: 4 training tasks (coins $(paste -sd' ' "$M/inclusion")) → 4 scoring tasks → audit (exit $audit_rc) = the same audit in one process"
echo "    many-runs audit: $((SECONDS - t_b)) s"

# --- (f) a sweep split into grid slices and joined --------------------------------------------------
t_f=$SECONDS
W=$D/sweep
mkdir -p "$W/logs"
sampler=$repo/fixtures/samplers/edm-cifar10-subsampled.toml
sweep_args="--sample-rate 0.01,0.5 --accountant gdp,clt,pld"
"$tpl/sweep-grid.sh" "$bin" "$sampler" 0.002..5 203 "$W/grid.txt" --log
# 203 values in 4 slices of 51, each swept in runs of at most 20 (CHUNK), the last slice short.
slices=$(OUT=$W CONFIG=$sampler SLICES=4 SWEEP_ARGS=$sweep_args CHUNK=20 \
  submit --array=0-3 --output="$W/logs/%x-%A_%a.out" "$tpl/sweep-slice.sbatch")
join=$(OUT=$W SLICES=4 submit --dependency=afterok:"$slices" --output="$W/logs/%x-%j.out" "$tpl/sweep-merge.sbatch")
wait_done "$slices" "$join"
[ "$(state "$join")" = "JobState=COMPLETED ExitCode=0:0" ] || fail "sweep merge: $(state "$join") ($(cat "$W/logs/"*merge*.out))"
# shellcheck disable=SC2086
(cd "$D" && "$bin" sweep "$sampler" --sigma-min 0.002..5 --points 203 --log $sweep_args --format csv -q >"$D/sweep-one.csv")
cmp "$W/sweep.csv" "$D/sweep-one.csv" || fail "(f) the joined sweep differs from the unsharded one"
[ "$(wc -l <"$W/sweep.csv")" = $((1 + 203 * 2)) ] || fail "(f) $(wc -l <"$W/sweep.csv") lines in the joined sweep"
ok "(f) a 203-point sweep in 4 slices on Slurm, joined = the unsharded sweep CSV byte for byte"
# The gathering steps name what is missing (run here as plain scripts: 5 expected, 4 exist).
set +e
msg=$(OUT=$W SLICES=5 bash "$tpl/sweep-merge.sbatch" 2>&1)
rc1=$?
msg2=$(OUT=$M RUNS=5 DPAUDIT=$bin bash "$tpl/runs-audit.sbatch" 2>&1)
rc2=$?
set -e
[ "$rc1" = 2 ] && grep -q "missing slice(s): 4/5" <<<"$msg" || fail "sweep merge with a slice missing: exit $rc1: $msg"
[ "$rc2" = 2 ] && grep -q "missing run(s): 4/5" <<<"$msg2" || fail "audit with a run missing: exit $rc2: $msg2"
ok "a missing slice or run is named (exit 2): $msg | $msg2"
echo "    sweep: $((SECONDS - t_f)) s"
