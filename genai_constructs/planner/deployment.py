"""Facts about what the constructs deploy, kept here so the planner can price a plan without importing aws_cdk.

The fleets (``genai_constructs/fleets``) and the network (``genai_constructs/network/private_data_path.py``) build
resources from these figures; the planner (``genai_constructs.planner.pricing``) prices the same resources from them.
One copy of each figure, so the bill the plan shows is the bill of the stack that is deployed.
"""

from __future__ import annotations

import math

DLAMI_ROOT_GIB = 100
"""The DLAMI root snapshots are 75-100 GiB (the Neuron DLAMI's is 100 GiB); size for the larger."""
CONTAINER_IMAGE_GIB = 40
"""A vLLM GPU image is ~11 GB compressed; pulling it holds the layers and the unpacked image at once."""
ROOT_VOLUME_HEADROOM = 0.2
"""Room for logs, caches (torch compile, CUDA graphs) and a second model version during a refresh."""


def root_volume_gib(
    weights_gib: float,
    *,
    os_gib: int = DLAMI_ROOT_GIB,
    image_gib: int = CONTAINER_IMAGE_GIB,
    headroom: float = ROOT_VOLUME_HEADROOM,
) -> int:
    """Root volume size: the AMI, the server image and the weights cached on EBS, plus headroom, in GiB.

    Weights live on the EBS root, never on instance store: a warm-pool instance is stopped, and a stop erases
    instance store (EC2 Auto Scaling user guide, warm pools).
    """
    return int(math.ceil((os_gib + image_gib + weights_gib) * (1 + headroom)))


INFERENCE_ROOT_VOLUME_THROUGHPUT_MIBPS = 1000
"""gp3 defaults to 125 MiB/s, which makes a 131 GiB model take 18 minutes to read from a warm-pool instance's root;
1000 MiB/s reads it in about 2.5. Costs about USD 35 per volume-month above the baseline. (The inference fleet's
``ROOT_VOLUME_THROUGHPUT_MIBPS``.)"""
INFERENCE_ROOT_VOLUME_IOPS = 4000
"""gp3 allows 0.25 MiB/s per provisioned IOPS: 1000 MiB/s needs 4000 IOPS. (The inference fleet's
``ROOT_VOLUME_IOPS``.)"""
EMBEDDING_ROOT_VOLUME_IOPS: int | None = None
"""The embedding fleet's launch template sets no IOPS: gp3's baseline (3,000 IOPS, no extra charge) applies."""
EMBEDDING_ROOT_VOLUME_THROUGHPUT_MIBPS: int | None = None
"""The embedding fleet's launch template sets no throughput: gp3's baseline (125 MiB/s, no extra charge) applies."""

SCALE_OUT_ROOM = 1
"""When the plan's peak fits in min_instances (max == min), the group still gets one instance of room: the latency
policy can answer traffic above the plan, and CloudFormation rejects target tracking on a group with max == min."""
WARM_POOL_MIN_SIZE = 1
"""One stopped, pre-loaded instance always waits: replacing a wedged instance or the first scale-out starts in
minutes rather than a full cold start, for the price of one stopped root volume."""

DEFAULT_INTERFACE_ENDPOINTS: dict[str, str] = {
    "sqs": "the embedding fleet's work queue and the enqueue helper",
    "logs": "the CloudWatch agent ships instance and server logs",
    "monitoring": "the CloudWatch agent and the sidecars put metrics",
    "ssm": "AMI IDs by SSM parameter, Session Manager instead of SSH",
    "ssmmessages": "Session Manager shell channels",
    "ec2messages": "SSM Agent command delivery",
    "ecr.api": "container image manifests and auth tokens",
    "ecr.dkr": "container image pulls (layers then come from S3 through the gateway endpoint)",
    "sts": "regional STS for role credentials and SDK calls that assume roles",
    "kms": "decrypting the KMS-encrypted EBS volumes, queues and objects",
    "autoscaling": "instances complete their own launch lifecycle hook (CompleteLifecycleAction, heartbeats) once weights are fetched and the server answers",
}
"""The interface VPC endpoints every private data path creates (short name -> why the instances need it), in the
order the network creates them. Each one is billed per Availability Zone it is placed in (AWS PrivateLink pricing)."""

DEFAULT_AVAILABILITY_ZONES = 2
"""The private data path's VPC spans two AZs by default: the fewest an internal ALB accepts (an Application Load
Balancer needs subnets in at least two Availability Zones: Elastic Load Balancing user guide, "Availability Zones
for your Application Load Balancer"), and the fewest that survive the loss of one AZ. Every interface endpoint is
placed in each of them."""
