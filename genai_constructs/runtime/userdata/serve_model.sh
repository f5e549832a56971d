# Body of the inference instance's user data. genai_constructs.fleets._launch.render_serving_user_data() puts
# "#!/bin/bash" and a block of readonly, shell-quoted settings above this line; nothing inside this body is
# substituted, so a value can never become code.
#
# Run by cloud-init at every boot (no argument, i.e. setup; the fleet sends "scripts-user, always"): installs
# itself as /opt/genai/bootstrap.sh, writes the systemd units, the health sidecar and the CloudWatch agent config,
# and starts everything; every step is idempotent. The units call it back with a subcommand. A warm-pool instance
# needs both: Auto Scaling may stop it before its first boot finished, and the next start must finish the job.
#
#   fetch    download the model version from S3 unless it is already cached and verified on the EBS root,
#            verify every file against the sha256 manifest (refuse to start on any mismatch), pull the image
#   serve    run the model server container in the foreground (systemd restarts it)
#   sidecar  run the health sidecar in the foreground
set -euo pipefail

readonly GENAI_HOME=/opt/genai
readonly LOG_DIR=/var/log/genai
readonly MODEL_DIR="${MODELS_ROOT}/${MODEL_VERSION}"
readonly VERIFIED_STAMP="${MODEL_DIR}/.verified-${MODEL_VERSION}"

log() {
  printf '%s genai-bootstrap: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2
}

die() {
  log "FATAL: $*"
  exit 1
}

verify_manifest() {
  # Every file under the model directory must be listed, and every listed file must match its sha256.
  local dir=$1 listed unlisted
  [[ -f "${dir}/${MANIFEST_NAME}" ]] || die "manifest ${MANIFEST_NAME} is missing under s3://${MODEL_BUCKET}/${MODEL_PREFIX}; refusing to start"
  (cd "${dir}" && sha256sum --check --strict --quiet "${MANIFEST_NAME}") \
    || die "sha256 mismatch against ${MANIFEST_NAME} for model version ${MODEL_VERSION}; refusing to start"
  listed=$(sed -E 's/^[0-9a-f]{64} [ *]//' "${dir}/${MANIFEST_NAME}" | sed 's|^\./||' | sort)
  unlisted=$(cd "${dir}" && find . -type f ! -name "${MANIFEST_NAME}" ! -name '.verified-*' | sed 's|^\./||' | sort \
    | comm -23 - <(printf '%s\n' "${listed}"))
  [[ -z "${unlisted}" ]] || die "files not in ${MANIFEST_NAME}: ${unlisted//$'\n'/, }; refusing to start"
}

fetch() {
  if [[ -f "${VERIFIED_STAMP}" ]]; then
    log "model version ${MODEL_VERSION} already cached and verified in ${MODEL_DIR}"
  else
    log "downloading s3://${MODEL_BUCKET}/${MODEL_PREFIX} to ${MODEL_DIR}"
    mkdir -p "${MODEL_DIR}"
    aws s3 sync --only-show-errors --region "${AWS_REGION_NAME}" "s3://${MODEL_BUCKET}/${MODEL_PREFIX}" "${MODEL_DIR}"
    verify_manifest "${MODEL_DIR}"
    touch "${VERIFIED_STAMP}"
    log "model version ${MODEL_VERSION} verified"
  fi
  # Older versions would fill the root volume: keep only the one this launch template serves.
  find "${MODELS_ROOT}" -mindepth 1 -maxdepth 1 -type d ! -name "${MODEL_VERSION}" -exec rm -rf {} +
  if ! docker image inspect "${IMAGE_URI}" > /dev/null 2>&1; then
    log "pulling ${IMAGE_URI}"
    aws ecr get-login-password --region "${AWS_REGION_NAME}" \
      | docker login --username AWS --password-stdin "${IMAGE_URI%%/*}"
    docker pull --quiet "${IMAGE_URI}"
  fi
}

serve() {
  [[ -f "${VERIFIED_STAMP}" ]] || die "model version ${MODEL_VERSION} is not verified; refusing to start"
  local -a accelerators=()
  if [[ "${ACCELERATOR_KIND}" == neuron ]]; then
    local device
    for device in /dev/neuron*; do
      [[ -e "${device}" ]] && accelerators+=(--device "${device}")
    done
  else
    accelerators=(--gpus all)
  fi
  docker rm --force model-server > /dev/null 2>&1 || true
  exec docker run --rm --name model-server --ipc host --network host \
    "${accelerators[@]}" \
    --volume "${MODEL_DIR}:${CONTAINER_MODEL_DIR}:ro" \
    --env "TENSOR_PARALLEL_SIZE=${TENSOR_PARALLEL_SIZE}" \
    --env "MAX_NUM_SEQS=${MAX_NUM_SEQS}" \
    "${SERVER_ENV[@]}" \
    --entrypoint "${SERVER_ENTRYPOINT}" \
    "${IMAGE_URI}" "${SERVER_ARGS[@]}"
}

sidecar() {
  exec python3 "${GENAI_HOME}/health_sidecar.py" \
    --upstream "http://127.0.0.1:${SERVER_PORT}" --model "${SERVED_MODEL_NAME}" \
    --port "${HEALTH_PORT}" --path "${HEALTH_PATH}" --timeout-s "${HEALTH_PROBE_TIMEOUT_S}" \
    --emf-address 127.0.0.1:25888 --namespace "${METRIC_NAMESPACE}" --fleet "${FLEET_NAME}" \
    --log-group "${LOG_GROUP_NAME}"
}

write_unit() {
  local name=$1
  cat > "/etc/systemd/system/${name}.service"
}

setup() {
  mkdir -p "${GENAI_HOME}" "${LOG_DIR}" "${MODELS_ROOT}"
  install -m 0755 "$0" "${GENAI_HOME}/bootstrap.sh"
  base64 --decode <<< "${SIDECAR_PY_GZ_B64}" | gunzip > "${GENAI_HOME}/health_sidecar.py"

  write_unit genai-model-fetch <<UNIT
[Unit]
Description=Download and verify model version ${MODEL_VERSION}, pull the server image
Wants=network-online.target docker.service
After=network-online.target docker.service
[Service]
Type=oneshot
RemainAfterExit=yes
TimeoutStartSec=${FETCH_TIMEOUT_S}
ExecStart=${GENAI_HOME}/bootstrap.sh fetch
StandardOutput=append:${LOG_DIR}/bootstrap.log
StandardError=append:${LOG_DIR}/bootstrap.log
[Install]
WantedBy=multi-user.target
UNIT

  write_unit genai-model-server <<UNIT
[Unit]
Description=OpenAI-compatible model server (${SERVED_MODEL_NAME} ${MODEL_VERSION})
Requires=genai-model-fetch.service docker.service
After=genai-model-fetch.service docker.service
[Service]
ExecStart=${GENAI_HOME}/bootstrap.sh serve
Restart=always
RestartSec=10
StandardOutput=append:${LOG_DIR}/model-server.log
StandardError=append:${LOG_DIR}/model-server.log
[Install]
WantedBy=multi-user.target
UNIT

  write_unit genai-health-sidecar <<UNIT
[Unit]
Description=Health sidecar: one-token probe of the model server for the load balancer
After=network-online.target
[Service]
ExecStart=${GENAI_HOME}/bootstrap.sh sidecar
Restart=always
RestartSec=2
StandardOutput=append:${LOG_DIR}/health-sidecar.log
StandardError=append:${LOG_DIR}/health-sidecar.log
[Install]
WantedBy=multi-user.target
UNIT

  local agent_config=/opt/aws/amazon-cloudwatch-agent/etc/genai-agent.json
  if [[ -x /opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl ]]; then
    printf '%s\n' "${CW_AGENT_CONFIG}" > "${agent_config}"
    /opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s \
      -c "file:${agent_config}"
  else
    log "WARNING: the CloudWatch agent is not installed in this AMI; GPU, memory and disk metrics will be missing"
  fi

  systemctl daemon-reload
  systemctl enable genai-model-fetch.service genai-model-server.service genai-health-sidecar.service
  systemctl start --no-block genai-health-sidecar.service genai-model-server.service
}

case "${1:-setup}" in
  setup) setup ;;
  fetch) fetch ;;
  serve) serve ;;
  sidecar) sidecar ;;
  *) die "unknown subcommand $1 (setup, fetch, serve, sidecar)" ;;
esac
