"""``python -m genai_constructs.testing``: the local deploy (``make deploy-local``)."""

import sys

from genai_constructs.testing.local_deploy import main

sys.exit(main())
