import os

# The jsii runtime prints a banner about Node 20 support on every start; it is noise in test output.
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
