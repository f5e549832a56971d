import os

# jsii prints a banner about Node 20's end of life on every start; the CI machine runs Node 20, so it is noise here.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
