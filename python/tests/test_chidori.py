"""Tests of the installed ``chidori`` package outside ``chidori run``.

``cargo xtask wheel --check-install`` runs them with the Python of a fresh venv the wheel
was installed into: ``python -m unittest discover -s python/tests``.
"""

from __future__ import annotations

import os
import re
import unittest
from typing import Callable, Optional
from unittest import mock

import chidori
import chidori._find


def _fake_stats_function(json_text: bytes) -> Callable[..., int]:
    """A stand-in for libchidori.so's ``chidori_stats_json``."""

    def function(buffer: Optional[object], capacity: int) -> int:
        if buffer is not None and len(json_text) <= capacity:
            buffer.raw = json_text + b"\0" * (capacity - len(json_text))  # type: ignore[attr-defined]
        return len(json_text)

    return function


class OutsideChidoriRun(unittest.TestCase):
    def setUp(self) -> None:
        patcher = mock.patch.dict(os.environ)
        patcher.start()
        self.addCleanup(patcher.stop)
        os.environ.pop("CHIDORI_SERVER", None)

    def test_the_version_is_the_workspaces(self) -> None:
        self.assertRegex(chidori.__version__, r"^\d+\.\d+\.\d+")

    def test_nothing_is_remote(self) -> None:
        self.assertFalse(chidori.is_remote())
        self.assertIsNone(chidori.server())
        self.assertEqual(chidori.stats(), {})
        self.assertEqual(chidori.waits(), [])

    def test_the_variable_alone_is_not_remote(self) -> None:
        # Inherited by a process that does not preload the client library.
        os.environ["CHIDORI_SERVER"] = "gpu-box"
        self.assertFalse(chidori.is_remote())
        self.assertEqual(chidori.stats(), {})

    def test_the_installed_files_are_found(self) -> None:
        self.assertTrue((chidori.lib_dir() / "libchidori.so").is_file())
        self.assertTrue((chidori.lib_dir() / "libcudart.so.13").is_file())
        self.assertTrue((chidori.profiles_dir() / "nvidia-h200.json").is_file())
        self.assertTrue(os.access(chidori.find_binary(), os.X_OK))


class UnderChidoriRun(unittest.TestCase):
    """With the client library's function replaced by a stand-in."""

    def setUp(self) -> None:
        patcher = mock.patch.dict(os.environ)
        patcher.start()
        self.addCleanup(patcher.stop)
        row = b'{"calls":2,"round_trips":1,"bytes_sent":10,"bytes_received":20,"ms_waiting":0.5}'
        self.json = b'{"functions":{"cudaMalloc":' + row + b'},"total":' + row + b"}"
        stats_patch = mock.patch.object(
            chidori, "_stats_function", return_value=_fake_stats_function(self.json)
        )
        stats_patch.start()
        self.addCleanup(stats_patch.stop)

    def test_the_server_gets_the_default_port(self) -> None:
        for address, expected in [
            ("gpu-box", "gpu-box:43211"),
            ("gpu-box:5000", "gpu-box:5000"),
            ("10.0.0.2:+80", "10.0.0.2:+80"),
            ("gpu-box:99999", "gpu-box:99999:43211"),
            ("[::1]", "[::1]:43211"),
            ("[::1]:7000", "[::1]:7000"),
        ]:
            os.environ["CHIDORI_SERVER"] = address
            self.assertTrue(chidori.is_remote())
            self.assertEqual(chidori.server(), expected, address)

    def test_stats_are_per_function_plus_the_total(self) -> None:
        os.environ["CHIDORI_SERVER"] = "gpu-box"
        stats = chidori.stats()
        self.assertEqual(set(stats), {"cudaMalloc", "total"})
        self.assertEqual(stats["cudaMalloc"]["calls"], 2)
        self.assertEqual(stats["total"]["ms_waiting"], 0.5)

    def test_waits_are_empty_unless_the_library_places_them(self) -> None:
        os.environ["CHIDORI_SERVER"] = "gpu-box"
        self.assertEqual(chidori.waits(), [])
        site = b'{"where":"train.py:57","in":"step","source":"loss.item()","round_trips":60,' \
            b'"ms_waiting":4200.0,"waited_for":"cudaStreamSynchronize"}'
        document = self.json[:-1] + b',"sources":[' + site + b"]}"
        with mock.patch.object(chidori, "_stats_function", return_value=_fake_stats_function(document)):
            sites = chidori.waits()
        self.assertEqual(len(sites), 1)
        self.assertEqual((sites[0]["where"], sites[0]["round_trips"]), ("train.py:57", 60))


class Layout(unittest.TestCase):
    def test_the_binary_search_names_every_place_it_looked(self) -> None:
        with mock.patch.object(chidori._find, "_candidates", return_value=iter([])):
            with self.assertRaises(FileNotFoundError) as raised:
                chidori.find_binary()
        self.assertTrue(re.search(r"pip install chidori", str(raised.exception)))


if __name__ == "__main__":
    unittest.main()


class DecodeWithoutTorch(unittest.TestCase):
    """The parts of server-side decode that need neither torch nor a server."""

    def test_optimize_before_transformers_waits_for_its_import(self) -> None:
        import sys

        import chidori.decode as decode

        with mock.patch.object(sys, "meta_path", list(sys.meta_path)), \
                mock.patch.object(decode, "_hook_installed", False), \
                mock.patch.dict(sys.modules, {"transformers.generation.utils": None}):
            del sys.modules["transformers.generation.utils"]
            decode.optimize()
            self.addCleanup(decode.optimize, False)
            self.assertTrue(decode._enabled)
            self.assertTrue(any(isinstance(f, decode._PatchOnImport) for f in sys.meta_path))

    def test_a_loop_outside_chidori_run_is_an_error(self) -> None:
        import chidori.decode as decode

        with mock.patch.object(decode, "_loop_api", return_value=None):
            with self.assertRaisesRegex(RuntimeError, "chidori run"):
                decode.run_loop(1, 0, 10, 2, 0, 0, 0, 0)

    def test_the_output_ends_where_every_sequence_has_ended(self) -> None:
        import chidori.decode as decode

        class Rows:
            def __init__(self, rows: list[list[int]]) -> None:
                self.rows = rows
                self.shape = (len(rows), len(rows[0]))

            def __getitem__(self, t: int) -> "Row":
                return Row(self.rows[t])

        class Row:
            def __init__(self, values: list[int]) -> None:
                self.values = values

            def tolist(self) -> list[int]:
                return self.values

        plan = decode._Plan(None, None, 5, 0, [2], 0, False, [], None, False)
        rows = Rows([[5, 6], [2, 7], [0, 8], [0, 2], [0, 0]])
        self.assertEqual(decode._generated_length(rows, plan, 5), 4)
        # The rows the host has suffice once every sequence has ended within them.
        self.assertTrue(decode._ended_within(rows, plan, 4))
        self.assertFalse(decode._ended_within(rows, plan, 3))
        plan.eos = None
        self.assertEqual(decode._generated_length(rows, plan, 5), 5)
        self.assertFalse(decode._ended_within(rows, plan, 5))
