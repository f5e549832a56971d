# Body of the inference instance's user data. genai_constructs.fleets._launch.render_serving_user_data() puts
# "#!/bin/bash", a block of readonly, shell-quoted settings and common.sh (logging, the manifest check, instance
# metadata, the launch lifecycle hook) above this line; nothing inside this body is substituted, so a value can
# never become code.
#
# Run by cloud-init at every boot (no argument, i.e. setup; the fleet sends "scripts-user, always"): installs
# itself as /opt/genai/bootstrap.sh, writes the systemd units and the CloudWatch agent config, and starts
# genai-lifecycle.service; every step is idempotent. The units call it back with a subcommand:
#
#   lifecycle  one oneshot unit per boot, so cloud-init is not held for the download: read the target lifecycle
#              state; fetch; on a warm-pool launch (Warmed:*) stop there, the instance is about to be stopped and
#              its EBS root keeps the weights and the image; in service (a launch straight into the group, or a
#              warm-pool instance resuming) start the server, the sidecar and the proxy and wait for the sidecar's
#              200; then complete the launch hook with CONTINUE, or ABANDON on a fatal error. Heartbeats meanwhile.
#   fetch      download the model version from S3 unless it is already cached and verified on the EBS root,
#              verify every file against the sha256 manifest (refuse to start on any mismatch), pull the image,
#              install the health sidecar and the request proxy
#   serve N    run model server replica N (0 to REPLICAS_PER_INSTANCE - 1) in the foreground (systemd restarts it)
#   sidecar    run the health sidecar in the foreground
#   proxy      run the request proxy in the foreground: the load balancer's target, in front of the server

readonly GENAI_HOME="${FS_ROOT}/opt/genai" LOG_DIR="${FS_ROOT}/var/log/genai"
readonly MODEL_DIR="${MODELS_ROOT}/${MODEL_VERSION}"
readonly VERIFIED_STAMP="${MODEL_DIR}/.verified-${MODEL_VERSION}"

# The health sidecar and the request proxy: from the S3 object RUNTIME_CODE_KEY (a zip) when there is one, else from
# the payloads in the settings (gzipped, base64). The request proxy is too large for EC2's 16 KB user data.
install_runtime() {
  mkdir -p "${GENAI_HOME}"
  if [[ -n "${RUNTIME_CODE_KEY}" ]]; then
    aws s3 cp --only-show-errors --region "${AWS_REGION_NAME}" "s3://${RUNTIME_CODE_BUCKET}/${RUNTIME_CODE_KEY}" \
      "${GENAI_HOME}/runtime.zip"
    python3 -m zipfile -e "${GENAI_HOME}/runtime.zip" "${GENAI_HOME}/"
  else
    base64 --decode <<< "${SIDECAR_PY_GZ_B64}" | gunzip > "${GENAI_HOME}/health_sidecar.py"
    base64 --decode <<< "${PROXY_PY_GZ_B64}" | gunzip > "${GENAI_HOME}/request_proxy.py"
  fi
}

fetch() {
  sync_verified "${MODEL_DIR}" "${VERIFIED_STAMP}" "model version ${MODEL_VERSION}"
  # Older versions would fill the root volume: keep only the one this launch template serves.
  find "${MODELS_ROOT}" -mindepth 1 -maxdepth 1 -type d ! -name "${MODEL_VERSION}" -exec rm -rf {} +
  pull_image "${IMAGE_URI}"
  install_runtime
}

# Replica N's unit, container and upstream port. One replica keeps the plain names; replica N listens on
# UPSTREAM_PORT + N on the loopback.
replica_name() {
  if (( REPLICAS_PER_INSTANCE == 1 )); then echo model-server; else echo "model-server-$1"; fi
}

replica_units() {
  local replica
  for ((replica = 0; replica < REPLICAS_PER_INSTANCE; replica++)); do
    printf 'genai-%s.service\n' "$(replica_name "${replica}")"
  done
}

# host:port of every replica, each after the flag $1 (the sidecar's and the proxy's repeated --upstream).
upstream_flags() {
  local replica
  for ((replica = 0; replica < REPLICAS_PER_INSTANCE; replica++)); do
    printf '%s\n%s%s\n' "$1" "$2" "127.0.0.1:$((UPSTREAM_PORT + replica))"
  done
}

# Poll the sidecar until it answers 200, for at most LIFECYCLE_HEARTBEAT_S (the hook's heartbeat timeout, sized to
# the model's load time); each poll is bounded above the sidecar's worst case (probe and progress scrape). The
# sidecar answers 200 only once every replica answers its own probe, so this waits for all of them.
wait_healthy() {
  local url="http://127.0.0.1:${HEALTH_PORT}${HEALTH_PATH}" end=$((SECONDS + LIFECYCLE_HEARTBEAT_S)) pause limit
  local answer=""
  read -r pause limit < <(awk -v s="${LIFECYCLE_HEARTBEAT_S}" -v t="${HEALTH_PROBE_TIMEOUT_S}" \
    'BEGIN { p = s / 30; print (p < 5 ? p : 5), 2 * t + 1 }')
  until answer=$(curl -s -w '\n%{http_code}' --max-time "${limit}" "${url}") && [[ "${answer##*$'\n'}" == 200 ]]; do
    (( SECONDS < end )) || die "the health sidecar did not answer 200 on ${url} within ${LIFECYCLE_HEARTBEAT_S} s; its last answer: ${answer%$'\n'*}"
    sleep "${pause}"
  done
  log "the model server answers: ${url} returned 200 (${REPLICAS_PER_INSTANCE} replica(s))"
}

# Both fleets keep their warm pools Stopped: an instance put in service boots again, so this step runs again then,
# with target state InService.
lifecycle() {
  lifecycle_begin
  # A child process, so that the fetch's own "die" ends only the fetch, and FETCH_TIMEOUT_S bounds it.
  timeout "${FETCH_TIMEOUT_S}" "${BASH}" "$0" fetch || die "fetch failed or ran past ${FETCH_TIMEOUT_S} s"
  if [[ "${TARGET_STATE}" == Warmed:* ]]; then
    log "warm-pool launch: weights and image are on the EBS root; the server starts when this instance is put in service"
  else
    local -a units
    mapfile -t units < <(replica_units)
    systemctl start --no-block "${units[@]}" genai-health-sidecar.service genai-request-proxy.service
    wait_healthy
  fi
  lifecycle_complete CONTINUE
}

# Replica N's devices. One replica takes every device (as the plan sized it). Several: replica N takes devices
# N x DEVICES_PER_REPLICA onwards. NVIDIA: docker's --gpus '"device=0,1"' exposes those GPUs only (Docker docs,
# "docker container run": --gpus). Neuron: the replica's chips as /dev/neuronN devices (Neuron containers FAQ: devices
# are exposed with --device, one per chip) and NEURON_RT_VISIBLE_CORES, the range of NeuronCores the process reserves
# (Neuron Runtime configuration guide: "give each process its own slice of cores"), TENSOR_PARALLEL_SIZE of them:
# one rank per NeuronCore, two NeuronCores per Inferentia2/Trainium chip.
replica_devices() {
  local replica=$1 first last device
  if (( REPLICAS_PER_INSTANCE == 1 )); then
    if [[ "${ACCELERATOR_KIND}" == neuron ]]; then
      for device in /dev/neuron*; do
        [[ -e "${device}" ]] && printf '%s\n' --device "${device}"
      done
    else
      printf '%s\n' --gpus all
    fi
    return 0
  fi
  first=$((replica * DEVICES_PER_REPLICA))
  last=$((first + DEVICES_PER_REPLICA - 1))
  if [[ "${ACCELERATOR_KIND}" == neuron ]]; then
    for ((device = first; device <= last; device++)); do
      printf '%s\n' --device "/dev/neuron${device}"
    done
    printf '%s\n' --env "NEURON_RT_VISIBLE_CORES=$((replica * TENSOR_PARALLEL_SIZE))-$(((replica + 1) * TENSOR_PARALLEL_SIZE - 1))"
  else
    printf '%s\n' --gpus "\"device=$(seq -s, "${first}" "${last}")\""
  fi
}

serve() {
  local replica=${1:-0} name
  if ! [[ "${replica}" =~ ^[0-9]+$ ]] || (( replica >= REPLICAS_PER_INSTANCE )); then
    die "replica ${replica} does not exist: this instance runs replicas 0 to $((REPLICAS_PER_INSTANCE - 1))"
  fi
  [[ -f "${VERIFIED_STAMP}" ]] || die "model version ${MODEL_VERSION} is not verified; refusing to start"
  local -a accelerators
  mapfile -t accelerators < <(replica_devices "${replica}")
  name=$(replica_name "${replica}")
  docker rm --force "${name}" > /dev/null 2>&1 || true
  # Every replica's unit appends to model-server.log: with several, each line says which replica wrote it.
  if (( REPLICAS_PER_INSTANCE > 1 )); then
    exec > >(sed -u "s/^/[replica ${replica}] /") 2>&1
  fi
  # Bridge networking, the server's port published on loopback only: in its own network namespace the container is
  # one hop from the instance, so the IMDSv2 token response (hop limit 1) never reaches it, and neither do the
  # instance role's credentials (EC2 user guide, "Configure the Instance Metadata Service options": hop limit and
  # containers). Only the request proxy, on the host, reaches it. The server binds every address of its own
  # namespace. --ipc host shares the host's IPC namespace for NCCL's shared memory, not its network.
  # VLLM_HTTP_TIMEOUT_KEEP_ALIVE: vLLM's HTTP keep-alive (5 s by default, read in vllm/envs.py), set like the
  # proxy's own to KEEP_ALIVE_S, above the load balancer's idle timeout: the proxy's pooled upstream connections stay
  # open instead of being closed under it every 5 s.
  exec docker run --rm --name "${name}" --ipc host \
    --publish "127.0.0.1:$((UPSTREAM_PORT + replica)):${SERVER_PORT}" \
    "${accelerators[@]}" \
    --volume "${MODEL_DIR}:${CONTAINER_MODEL_DIR}:ro" \
    --env "TENSOR_PARALLEL_SIZE=${TENSOR_PARALLEL_SIZE}" \
    --env "MAX_NUM_SEQS=${MAX_NUM_SEQS}" \
    --env "VLLM_HTTP_TIMEOUT_KEEP_ALIVE=${KEEP_ALIVE_S}" \
    "${SERVER_ENV[@]}" \
    --entrypoint "${SERVER_ENTRYPOINT}" \
    "${IMAGE_URI}" "${SERVER_ARGS[@]}"
}

sidecar() {
  local -a upstreams
  mapfile -t upstreams < <(upstream_flags --upstream http://)
  exec python3 "${GENAI_HOME}/health_sidecar.py" \
    "${upstreams[@]}" --model "${SERVED_MODEL_NAME}" \
    --port "${HEALTH_PORT}" --path "${HEALTH_PATH}" --timeout-s "${HEALTH_PROBE_TIMEOUT_S}" \
    --emf-address 127.0.0.1:25888 --namespace "${METRIC_NAMESPACE}" --fleet "${FLEET_NAME}" \
    --log-group "${LOG_GROUP_NAME}"
}

# --max-concurrency is per replica (vLLM's --max-num-seqs of each); the proxy routes to the least busy replica.
proxy() {
  local instance_id zone
  local -a upstreams
  instance_id=$(imds instance-id) || die "no instance ID from IMDS"
  zone=$(imds placement/availability-zone) || die "no availability zone from IMDS"
  mapfile -t upstreams < <(upstream_flags --upstream "")
  exec python3 "${GENAI_HOME}/request_proxy.py" --listen "0.0.0.0:${SERVER_PORT}" \
    "${upstreams[@]}" --max-concurrency "${MAX_NUM_SEQS}" --keep-alive-s "${KEEP_ALIVE_S}" \
    --upstream-keep-alive-s "${KEEP_ALIVE_S}" \
    --drain-s "${DRAIN_S}" --emf-address tcp:127.0.0.1:25888 --namespace "${METRIC_NAMESPACE}" \
    --fleet "${FLEET_NAME}" --model-version "${MODEL_VERSION}" --log-group "${LOG_GROUP_NAME}" \
    --instance-id "${instance_id}" --availability-zone "${zone}" --metrics-interval-s 10
}

# A unit: $1 its name (genai-$1.service), $2 its log file's name under LOG_DIR (the CloudWatch agent config collects
# those files by name), $3 its description, $4 the subcommand, then extra lines for [Service] and after.
write_unit() {
  local name=$1 logfile="${LOG_DIR}/$2.log" description=$3 subcommand=$4
  shift 4
  {
    printf '[Unit]\nDescription=%s\nWants=network-online.target docker.service\n' "${description}"
    printf 'After=network-online.target docker.service\n[Service]\nExecStart=%s/bootstrap.sh %s\n' \
      "${GENAI_HOME}" "${subcommand}"
    printf 'StandardOutput=append:%s\nStandardError=append:%s\n' "${logfile}" "${logfile}"
    printf '%s\n' "$@"
  } > "${FS_ROOT}/etc/systemd/system/genai-${name}.service"
}

setup() {
  mkdir -p "${GENAI_HOME}" "${LOG_DIR}" "${MODELS_ROOT}"
  # Replaced by a rename, never rewritten in place: the lifecycle unit may be running the previous copy.
  install -m 0755 "$0" "${GENAI_HOME}/bootstrap.sh.new"
  mv -f "${GENAI_HOME}/bootstrap.sh.new" "${GENAI_HOME}/bootstrap.sh"

  # The lifecycle step is the only unit enabled: at each boot it decides whether the others start (never on a
  # warm-pool launch). Its time limit is a backstop above the fetch's and the wait's own bounds.
  write_unit lifecycle bootstrap "Launch step: fetch model version ${MODEL_VERSION}, start serving, complete the launch hook" \
    lifecycle Type=oneshot RemainAfterExit=yes "TimeoutStartSec=$((FETCH_TIMEOUT_S + LIFECYCLE_HEARTBEAT_S + 300))" \
    '[Install]' WantedBy=multi-user.target
  local replica
  for ((replica = 0; replica < REPLICAS_PER_INSTANCE; replica++)); do
    write_unit "$(replica_name "${replica}")" model-server \
      "OpenAI-compatible model server (${SERVED_MODEL_NAME} ${MODEL_VERSION}), replica ${replica} of ${REPLICAS_PER_INSTANCE}" \
      "serve ${replica}" Restart=always RestartSec=10
  done
  write_unit health-sidecar health-sidecar "Health sidecar: one-token probe of the model server for the load balancer" sidecar \
    Restart=always RestartSec=2
  # The proxy drains in-flight requests for DRAIN_S after SIGTERM: systemd waits a little longer before SIGKILL.
  write_unit request-proxy request-proxy "Request proxy: the load balancer's target, in front of the model server" proxy \
    Restart=always RestartSec=2 KillSignal=SIGTERM "TimeoutStopSec=$((DRAIN_S + 30))"

  local agent="${FS_ROOT}/opt/aws/amazon-cloudwatch-agent"
  if [[ -x "${agent}/bin/amazon-cloudwatch-agent-ctl" ]]; then
    printf '%s\n' "${CW_AGENT_CONFIG}" > "${agent}/etc/genai-agent.json"
    "${agent}/bin/amazon-cloudwatch-agent-ctl" -a fetch-config -m ec2 -s -c "file:${agent}/etc/genai-agent.json"
  else
    log "WARNING: the CloudWatch agent is not installed in this AMI; GPU, memory and disk metrics will be missing"
  fi

  systemctl daemon-reload
  systemctl enable genai-lifecycle.service
  systemctl start --no-block genai-lifecycle.service
}

case "${1:-setup}" in
  setup) setup ;;
  lifecycle) lifecycle ;;
  fetch) fetch ;;
  serve) serve "${2:-0}" ;;
  sidecar) sidecar ;;
  proxy) proxy ;;
  *) die "unknown subcommand $1 (setup, lifecycle, fetch, serve, sidecar, proxy)" ;;
esac
