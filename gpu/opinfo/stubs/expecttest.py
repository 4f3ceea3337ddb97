"""Stand-in for the `expecttest` package where it is not installed (the GPU machine has no
network). torch.testing._internal.common_utils imports it only to derive its TestCase; the
OpInfo harness never runs a TestCase, so a plain unittest.TestCase is enough."""
import unittest


class TestCase(unittest.TestCase):
    """expecttest.TestCase without the expect-inline machinery."""
