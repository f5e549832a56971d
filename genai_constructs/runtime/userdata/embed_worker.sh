# Body of the embedding worker instance's user data. genai_constructs.fleets.embedding puts "#!/bin/bash", a block of
# readonly, shell-quoted settings and common.sh above this line; nothing inside this body is substituted.
#
# Run by cloud-init: once, or at every boot with a warm pool ("scripts-user, always"), so each step is safe to
# repeat. The encoder is small (minutes to fetch), so this runs inline rather than in a unit of its own. On a
# warm-pool launch (Warmed:*) it caches the encoder, the worker code and the image on the EBS root and completes the
# launch hook without starting a worker: the instance is about to be stopped. In service it starts one worker per
# GPU, then completes the hook. A failure completes the hook with ABANDON (common.sh).
readonly GENAI_HOME="${FS_ROOT}/opt/genai" GENAI_ETC="${FS_ROOT}/etc/genai" LOG_DIR="${FS_ROOT}/var/log/genai"
mkdir -p "${LOG_DIR}" "${GENAI_ETC}" "${GENAI_HOME}"
exec >> "${LOG_DIR}/bootstrap.log" 2>&1
log "bootstrap"
lifecycle_begin
# Instance-store NVMe: a disposable cache (RAID 0 when there are several); the EBS root otherwise. A stop wipes
# instance store (it is formatted again), a reboot keeps it (already assembled and mounted: left alone). With a warm
# pool the model is cached on the EBS root instead, since a Stopped warm-pool instance loses its instance store.
cache="${GENAI_HOME}/cache"
mapfile -t disks < <(lsblk -dpno NAME,MODEL | awk '/Amazon EC2 NVMe Instance Storage/ {print $1}')
if (( ${#disks[@]} > 0 )) && ! mountpoint -q "${INSTANCE_STORE_MOUNT}"; then
  dev=${disks[0]}
  if (( ${#disks[@]} > 1 )); then
    [[ -e /dev/md0 ]] || mdadm --create /dev/md0 --run --level=0 --raid-devices=${#disks[@]} "${disks[@]}"
    dev=/dev/md0
  fi
  blkid "${dev}" > /dev/null || mkfs.xfs -f "${dev}"
  mkdir -p "${INSTANCE_STORE_MOUNT}"
  mount -o noatime "${dev}" "${INSTANCE_STORE_MOUNT}"
fi
if mountpoint -q "${INSTANCE_STORE_MOUNT}" && [[ "${MODEL_CACHE_ON_EBS}" != 1 ]]; then
  cache=${INSTANCE_STORE_MOUNT}
fi
model="${cache}/model"
agent="${FS_ROOT}/opt/aws/amazon-cloudwatch-agent"
printf '%s' "${CW_AGENT_CONFIG}" > "${agent}/etc/genai-embedding.json"
"${agent}/bin/amazon-cloudwatch-agent-ctl" -a fetch-config -m ec2 -s -c "file:${agent}/etc/genai-embedding.json"
# The encoder, verified against its sha256 manifest like the inference fleet's weights; the stamp keeps a reboot (or
# a warm-pool instance put in service) from downloading or verifying it again.
sync_verified "${model}" "${model}/.verified-encoder" "the encoder under s3://${MODEL_BUCKET}/${MODEL_PREFIX}"
mkdir -p "${GENAI_HOME}/genai_constructs/runtime"
touch "${GENAI_HOME}/genai_constructs/__init__.py" "${GENAI_HOME}/genai_constructs/runtime/__init__.py"
aws s3 cp "s3://${WORKER_CODE_BUCKET}/${WORKER_CODE_KEY}" "${GENAI_HOME}/worker-code.zip" --only-show-errors \
  --region "${AWS_REGION_NAME}"
python3 -m zipfile -e "${GENAI_HOME}/worker-code.zip" "${GENAI_HOME}/genai_constructs/runtime/"
{
  printf 'GENAI_QUEUE_URL=%s\n' "${QUEUE_URL}"
  printf 'GENAI_OUTPUT_BUCKET=%s\n' "${OUTPUT_BUCKET}"
  printf 'GENAI_OUTPUT_PREFIX=%s\n' "${OUTPUT_PREFIX}"
  printf 'GENAI_BATCH_SIZE=%s\n' "${BATCH_SIZE}"
  printf 'GENAI_MAX_CONCURRENCY=%s\n' "${MAX_CONCURRENCY}"
  printf 'GENAI_CHUNK_TOKENS=%s\n' "${CHUNK_TOKENS}"
  printf 'GENAI_VISIBILITY_TIMEOUT_S=%s\n' "${VISIBILITY_TIMEOUT_S}"
  printf 'GENAI_METRICS_NAMESPACE=%s\n' "${METRIC_NAMESPACE}"
  printf 'GENAI_FLEET_NAME=%s\n' "${FLEET_NAME}"
  printf 'AWS_DEFAULT_REGION=%s\n' "${AWS_REGION_NAME}"
  printf 'HF_HUB_OFFLINE=1\nPYTHONPATH=/opt/genai\nPYTHONUNBUFFERED=1\n'
} > "${GENAI_ETC}/worker.env"
gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true)
(( gpus > 0 )) || gpus=1
if [[ -n "${WORKER_COMMAND}" ]]; then
  printf '%s\n' "${WORKER_COMMAND}" > "${GENAI_ETC}/worker-command.sh"
  start="/bin/bash ${GENAI_ETC}/worker-command.sh"
  stop=""
  pre=""
else
  pull_image "${WORKER_IMAGE}"
  # Host networking, and so the instance role, on purpose: the worker is this library's own batch_worker, which
  # calls SQS, S3 and CloudWatch with the role, and the role holds nothing else a worker would not need (the
  # fleet's queue, prefixes, keys, logs and metrics). On a bridge network it could not reach the instance metadata
  # (the IMDSv2 token's hop limit of 1: EC2 user guide, "Configure the Instance Metadata Service options"), hence no
  # credentials. The encoder it runs is data, not code: sentence-transformers loads the verified weights without
  # trust_remote_code.
  start="/usr/bin/docker run --rm --name genai-embed-%i --network host --gpus device=%i --env-file ${GENAI_ETC}/worker.env -v ${GENAI_HOME}:/opt/genai:ro -v ${model}:/model:ro ${WORKER_IMAGE} python3 -m genai_constructs.runtime.batch_worker --encoder sentence-transformers:/model --device cuda"
  stop="ExecStop=/usr/bin/docker stop -t ${WORKER_STOP_TIMEOUT_S} genai-embed-%i"
  pre="ExecStartPre=-/usr/bin/docker rm -f genai-embed-%i"
fi
# ConditionPathExists: a worker never starts on an encoder that did not pass its manifest.
cat > "${FS_ROOT}/etc/systemd/system/genai-embed@.service" << UNIT
[Unit]
Description=genai-constructs embedding worker on GPU %i
After=network-online.target docker.service
ConditionPathExists=${model}/.verified-encoder
[Service]
EnvironmentFile=${GENAI_ETC}/worker.env
Environment=CUDA_VISIBLE_DEVICES=%i
Environment=GENAI_ENCODER=sentence-transformers:${model}
${pre}
ExecStart=${start}
${stop}
KillSignal=SIGTERM
TimeoutStopSec=$((WORKER_STOP_TIMEOUT_S + 10))
Restart=on-failure
RestartSec=10
StandardOutput=append:${LOG_DIR}/worker.log
StandardError=append:${LOG_DIR}/worker.log
[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
if [[ "${TARGET_STATE}" == Warmed:* ]]; then
  log "warm-pool launch: encoder, code and image cached on the EBS root; the workers start when this instance is put in service"
else
  for ((i = 0; i < gpus; i++)); do systemctl enable --now "genai-embed@${i}"; done
  log "started ${gpus} worker(s)"
fi
lifecycle_complete CONTINUE
