#!/usr/bin/env python3
"""Tests of docs/check-links.py on a small built book and README made here.

    python3 docs/test_check_links.py
"""

import contextlib
import importlib.util
import io
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = importlib.util.spec_from_file_location("check_links", os.path.join(HERE, "check-links.py"))
check_links = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(check_links)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


class CheckLinks(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        self.book = os.path.join(self.root, "docs", "book")
        write(os.path.join(self.book, "index.html"), '<a href="guide/tls.html#redirect">ok</a>')
        write(
            os.path.join(self.book, "guide", "tls.html"),
            '<h2 id="redirect">Redirect</h2><a href="../index.html">up</a><a href="#redirect">self</a>'
            '<a href="https://example.com/x#y">external</a>',
        )
        write(os.path.join(self.root, "docs", "src", "guide", "tls.md"), "# TLS\n## Redirect\n")
        self.readme = os.path.join(self.root, "README.md")

    def tearDown(self):
        self.tmp.cleanup()

    def check(self, readme_text):
        write(self.readme, readme_text)
        book_errors, _ = check_links.check_book(self.book)
        readme_errors, _ = check_links.check_readme(self.readme, self.book)
        return book_errors + readme_errors

    def test_good_links_pass(self):
        errors = self.check(
            "# duet\n## Try it\n[a](#try-it) [b](docs/src/guide/tls.md#redirect) [c](https://x.y/#z)\n"
            "```sh\n[not](a-link.md)\n```\n"
        )
        self.assertEqual(errors, [])

    def test_broken_book_file_and_anchor_fail(self):
        write(
            os.path.join(self.book, "guide", "routing.html"),
            '<a href="tls.html#nope">a</a><a href="limits.html">b</a>',
        )
        errors = self.check("# duet\n")
        self.assertEqual(len(errors), 2, errors)
        self.assertIn("no anchor #nope", errors[0] + errors[1])
        self.assertIn("no file", errors[0] + errors[1])

    def test_broken_readme_links_fail(self):
        errors = self.check(
            "# duet\n[a](#install) [b](docs/src/guide/tls.md#nope) [c](docs/src/guide/nope.md)\n"
        )
        self.assertEqual(len(errors), 3, errors)

    def test_main_exits_1_on_a_broken_link(self):
        argv = ["check-links.py", self.book, self.readme]
        write(self.readme, "# duet\n[a](#nowhere)\n")
        with contextlib.redirect_stdout(io.StringIO()) as out:
            self.assertEqual(check_links.main(argv), 1)
        self.assertIn("#nowhere: no anchor", out.getvalue())
        write(self.readme, "# duet\n[a](#duet)\n")
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertEqual(check_links.main(argv), 0)

    def test_github_slugs(self):
        slugs = check_links.github_slugs("# Install with Helm\n## `--lb` and p2c!\n## Install with Helm\n")
        self.assertEqual(slugs, {"install-with-helm", "--lb-and-p2c", "install-with-helm-1"})


if __name__ == "__main__":
    unittest.main()
