"""Stand-in for the expecttest package, which PyTorch's test utilities
(torch.testing._internal.common_utils) import for its TestCase base class.
Debian 12 does not package it. tests/pytorch/gloo_suite.py puts this
directory on sys.path only when the real package is missing; the distributed
suite uses none of its inline-expectation assertions, so a plain comparison
stands in for them."""
import unittest

ACCEPT = False  # whether to rewrite expectations in place (never, here)


class TestCase(unittest.TestCase):
    longMessage = True

    def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802 (its API)
        self.assertEqual(expect.strip(), str(actual).strip())
