"""The retrieval tier: the vector store the RAG orchestrators read, one zone-local reader per AZ."""

from genai_constructs.retrieval.aurora import (
    DATABASE_NAME,
    DEFAULT_BACKUP_RETENTION,
    DEFAULT_ENGINE_VERSION,
    DEFAULT_REMOVAL_POLICY,
    PORT,
    TABLE,
    AuroraVectorStore,
)

__all__ = [
    "DATABASE_NAME",
    "DEFAULT_BACKUP_RETENTION",
    "DEFAULT_ENGINE_VERSION",
    "DEFAULT_REMOVAL_POLICY",
    "PORT",
    "TABLE",
    "AuroraVectorStore",
]
