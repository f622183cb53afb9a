# Lets the tests import the in-tree package (python/mok) without installing it;
# the package finds libmok_torch.so in $MOK_LIB_DIR or <repo>/build/python.
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
