"""Private networking: a VPC whose data path never touches a NAT gateway."""

from genai_constructs.network.private_data_path import (
    DEFAULT_INTERFACE_ENDPOINTS,
    KNOWN_EXTRA_INTERFACE_ENDPOINTS,
    PrivateDataPath,
    RetrievalService,
)

__all__ = [
    "DEFAULT_INTERFACE_ENDPOINTS",
    "KNOWN_EXTRA_INTERFACE_ENDPOINTS",
    "PrivateDataPath",
    "RetrievalService",
]
