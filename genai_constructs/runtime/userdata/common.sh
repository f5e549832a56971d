# Shared by the inference and the embedding boot scripts: each renderer puts "#!/bin/bash" and its readonly,
# shell-quoted settings above this file and its own body below it (genai_constructs.fleets._launch renders the
# inference script, genai_constructs.fleets.embedding the embedding one). Nothing here is substituted either.
#
# Settings this file reads: MODEL_BUCKET, MODEL_PREFIX, MANIFEST_NAME, AWS_REGION_NAME, LIFECYCLE_HOOK_NAME ("" for
# no hook), AUTO_SCALING_GROUP_NAME, LIFECYCLE_HEARTBEAT_S.
set -euo pipefail

# Instance metadata (IMDSv2 only: the launch templates require tokens). The tests point this at a local fake, and
# hang every path the scripts write off GENAI_FS_ROOT (a scratch directory); on an instance neither is set.
readonly IMDS_ENDPOINT="${IMDS_ENDPOINT:-http://169.254.169.254}"
readonly FS_ROOT="${GENAI_FS_ROOT:-}"
TARGET_STATE=""
INSTANCE_ID=""
HEARTBEAT_PID=""

log() {
  printf '%s genai-bootstrap: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2
}

die() {
  log "FATAL: $*"
  exit 1
}

# The model directory against its sha256 manifest (MANIFEST_NAME, "sha256sum" format, at the top of the model
# prefix): every file under the directory must be listed, and every listed file must match. $2 names the model in
# the messages.
verify_manifest() {
  local dir=$1 what=$2 listed unlisted
  [[ -f "${dir}/${MANIFEST_NAME}" ]] || die "manifest ${MANIFEST_NAME} is missing under s3://${MODEL_BUCKET}/${MODEL_PREFIX}; refusing to start"
  (cd "${dir}" && sha256sum --check --strict --quiet "${MANIFEST_NAME}") \
    || die "sha256 mismatch against ${MANIFEST_NAME} for ${what}; refusing to start"
  listed=$(sed -E 's/^[0-9a-f]{64} [ *]//' "${dir}/${MANIFEST_NAME}" | sed 's|^\./||' | sort)
  unlisted=$(cd "${dir}" && find . -type f ! -name "${MANIFEST_NAME}" ! -name '.verified-*' | sed 's|^\./||' | sort \
    | comm -23 - <(printf '%s\n' "${listed}"))
  [[ -z "${unlisted}" ]] || die "files not in ${MANIFEST_NAME}: ${unlisted//$'\n'/, }; refusing to start"
}

# Download s3://MODEL_BUCKET/MODEL_PREFIX into $1 and verify it, unless the stamp $2 says this was done already (a
# reboot, or a warm-pool instance put in service: the EBS root kept the files). $3 names the model in the messages.
sync_verified() {
  local dir=$1 stamp=$2 what=$3
  if [[ -f "${stamp}" ]]; then
    log "${what} already cached and verified in ${dir}"
    return 0
  fi
  log "downloading s3://${MODEL_BUCKET}/${MODEL_PREFIX} to ${dir}"
  mkdir -p "${dir}"
  aws s3 sync --only-show-errors --region "${AWS_REGION_NAME}" "s3://${MODEL_BUCKET}/${MODEL_PREFIX}" "${dir}"
  verify_manifest "${dir}" "${what}"
  touch "${stamp}"
  log "${what} verified"
}

pull_image() {
  if ! docker image inspect "$1" > /dev/null 2>&1; then
    log "pulling $1"
    aws ecr get-login-password --region "${AWS_REGION_NAME}" | docker login --username AWS --password-stdin "${1%%/*}"
    docker pull --quiet "$1"
  fi
}

# One instance metadata item ($1, under latest/meta-data/), IMDSv2: a session token from PUT latest/api/token first
# (EC2 user guide, "Use the Instance Metadata Service to access instance metadata"). Fails when it is unavailable.
imds() {
  local token
  token=$(curl -fs --max-time 2 --retry 3 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' \
    "${IMDS_ENDPOINT}/latest/api/token") || return 1
  curl -fs --max-time 2 --retry 3 -H "X-aws-ec2-metadata-token: ${token}" "${IMDS_ENDPOINT}/latest/meta-data/$1"
}

# The launch lifecycle hook. Auto Scaling stops a warm-pool instance as soon as it has launched, without waiting for
# user data, unless a launch hook holds it in Warmed:Pending:Wait until CompleteLifecycleAction; it runs the launch
# hooks again (Pending:Wait) when the instance leaves the warm pool (EC2 Auto Scaling user guide, "Use lifecycle
# hooks with a warm pool in Auto Scaling group"). The instance learns which launch this is from the metadata item
# autoscaling/target-lifecycle-state: InService, or Warmed:Stopped / Warmed:Running / Warmed:Hibernated (user guide,
# "Retrieve the target lifecycle state through instance metadata"); outside an Auto Scaling group the item does not
# exist, and the instance behaves as in service with no hook to complete.
hook() {
  local action=$1
  shift
  aws autoscaling "${action}" --region "${AWS_REGION_NAME}" --lifecycle-hook-name "${LIFECYCLE_HOOK_NAME}" \
    --auto-scaling-group-name "${AUTO_SCALING_GROUP_NAME}" --instance-id "${INSTANCE_ID}" "$@"
}

# Read the target state and, when there is a hook to complete, start the heartbeats: every LIFECYCLE_HEARTBEAT_S / 3
# seconds, RecordLifecycleActionHeartbeat restarts the hook's timeout (user guide, "Complete a lifecycle action in an
# Auto Scaling group"), so a slow download is not cut off. Any exit that is not a success completes the hook with
# ABANDON (lifecycle_end): for a launch hook it means the custom action failed and Auto Scaling terminates the
# instance (user guide, "Add lifecycle hooks to your Auto Scaling group": default result), and the group launches a
# replacement for its desired capacity at once instead of after the heartbeat timeout.
lifecycle_begin() {
  trap lifecycle_end EXIT
  TARGET_STATE=$(imds autoscaling/target-lifecycle-state) || TARGET_STATE=""
  log "target lifecycle state: ${TARGET_STATE:-none (not in an Auto Scaling group: in service, no hook)}"
  [[ -n "${TARGET_STATE}" && -n "${LIFECYCLE_HOOK_NAME}" ]] || return 0
  INSTANCE_ID=$(imds instance-id) || { log "no instance ID from IMDS: cannot complete the launch hook"; return 0; }
  local every
  every=$(awk -v s="${LIFECYCLE_HEARTBEAT_S}" 'BEGIN { print s / 3 }')
  # A trap on TERM ends the pending sleep too: heartbeats_stop leaves no process behind.
  (
    trap 'kill "${nap:-}" 2> /dev/null; exit 0' TERM
    while :; do
      sleep "${every}" &
      nap=$!
      wait "${nap}"
      hook record-lifecycle-action-heartbeat || log "lifecycle heartbeat failed"
    done
  ) &
  HEARTBEAT_PID=$!
}

heartbeats_stop() {
  if [[ -n "${HEARTBEAT_PID}" ]]; then
    kill "${HEARTBEAT_PID}" 2> /dev/null || true
    wait "${HEARTBEAT_PID}" 2> /dev/null || true
    HEARTBEAT_PID=""
  fi
}

# Complete the launch hook once with $1 (CONTINUE or ABANDON). It fails harmlessly when no hook is waiting: a reboot
# of an instance already in service runs this step again.
lifecycle_complete() {
  heartbeats_stop
  [[ -n "${INSTANCE_ID}" ]] || return 0
  if hook complete-lifecycle-action --lifecycle-action-result "$1"; then
    log "launch hook ${LIFECYCLE_HOOK_NAME} completed: $1"
  else
    log "complete-lifecycle-action $1 failed: no launch hook is waiting (a reboot), or it timed out"
  fi
  INSTANCE_ID=""
}

lifecycle_end() {
  local status=$?
  if (( status != 0 )) && [[ -n "${INSTANCE_ID}" ]]; then
    log "the launch failed (exit ${status}, reason above): ABANDON, so Auto Scaling replaces this instance now"
    lifecycle_complete ABANDON
  fi
  heartbeats_stop
}
