# Body of the CPU tiers' user data (the document preprocessing fleet and the RAG orchestration fleet).
# genai_constructs.fleets._launch.render_cpu_tier_user_data puts "#!/bin/bash", a block of readonly, shell-quoted
# settings and userdata/common.sh above this line; nothing inside this body is substituted.
#
# Settings: IMAGE_URI, AWS_REGION_NAME, CW_AGENT_CONFIG, SECRET_ARN ("" for none; only logged here), STOP_TIMEOUT_S,
# and the arrays SERVICE_NAMES and SERVICE_ARGS (one string of shell-quoted arguments after the image per service; the
# word @AVAILABILITY_ZONE@ in them is replaced by this instance's zone from IMDSv2).
readonly GENAI_ETC="${FS_ROOT}/etc/genai" LOG_DIR="${FS_ROOT}/var/log/genai"
mkdir -p "${LOG_DIR}" "${GENAI_ETC}" "${FS_ROOT}/etc/systemd/system"
exec >> "${LOG_DIR}/bootstrap.log" 2>&1
log "bootstrap"
# Docker and the CloudWatch agent from the Amazon Linux 2023 repositories (an S3 bucket the private data path's
# gateway endpoint allows): the plain AL2023 AMI carries neither.
if ! command -v docker > /dev/null 2>&1; then
  dnf install -y --quiet docker amazon-cloudwatch-agent
fi
systemctl enable --now docker
agent="${FS_ROOT}/opt/aws/amazon-cloudwatch-agent"
mkdir -p "${agent}/etc"
printf '%s' "${CW_AGENT_CONFIG}" > "${agent}/etc/genai-cpu-tier.json"
"${agent}/bin/amazon-cloudwatch-agent-ctl" -a fetch-config -m ec2 -s -c "file:${agent}/etc/genai-cpu-tier.json"
pull_image "${IMAGE_URI}"
zone=$(imds placement/availability-zone) || die "no availability zone from IMDSv2"
# The programs read the database secret themselves with the instance role (--secret-arn): the orchestrator again
# when a reader refuses the password after a rotation, the loader at each start (systemd restarts it when a connect
# fails). So nothing here writes the user or the password to disk, where a rotation would leave a stale copy; the
# containers' env file holds the Region only.
[[ -z "${SECRET_ARN}" ]] || log "the services read the database secret ${SECRET_ARN} themselves"
printf 'AWS_DEFAULT_REGION=%s\nAWS_REGION=%s\n' "${AWS_REGION_NAME}" "${AWS_REGION_NAME}" > "${GENAI_ETC}/cpu-tier.env"
for i in "${!SERVICE_NAMES[@]}"; do
  name=${SERVICE_NAMES[$i]}
  args=${SERVICE_ARGS[$i]//@AVAILABILITY_ZONE@/${zone}}
  # Host networking, and so the instance role, on purpose (the embedding worker's decision, embed_worker.sh): the
  # programs are this library's own, they call SQS, S3, Secrets Manager and CloudWatch with the role, and the role
  # holds nothing else; on a bridge network the IMDSv2 hop limit of 1 would leave them without credentials.
  cat > "${FS_ROOT}/etc/systemd/system/genai-${name}.service" << UNIT
[Unit]
Description=genai-constructs ${name}
After=network-online.target docker.service
Requires=docker.service
[Service]
Restart=always
RestartSec=5
ExecStartPre=-/usr/bin/docker rm -f genai-${name}
ExecStart=/usr/bin/docker run --rm --name genai-${name} --network host --read-only --tmpfs /tmp --env-file ${GENAI_ETC}/cpu-tier.env --log-driver none ${IMAGE_URI} ${args}
ExecStop=/usr/bin/docker stop -t ${STOP_TIMEOUT_S} genai-${name}
StandardOutput=append:${LOG_DIR}/${name}.log
StandardError=append:${LOG_DIR}/${name}.log
[Install]
WantedBy=multi-user.target
UNIT
done
systemctl daemon-reload
for name in "${SERVICE_NAMES[@]}"; do
  systemctl enable --now "genai-${name}.service"
  log "started genai-${name}"
done
log "bootstrap done"
