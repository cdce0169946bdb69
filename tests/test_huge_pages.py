"""The huge-page pass (runtime/huge_pages.py).  A pass changes the process for good -- its mappings stay advised,
so later allocations in them get huge pages, and its thread stays -- so every test that starts one runs it in a
Python process of its own (`in_own_process`), whatever an earlier test on the same worker did."""
import json
import subprocess
import sys
import textwrap

import pytest

from runtime import huge_pages

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge pages are asked of Linux only")


def in_own_process(body: str, tmp_path) -> dict:
    """Run `body` (Python that sets `result`, a dict) in a fresh interpreter with the huge-page setting read as
    madvise; returns `result`, with the process's stderr as result["stderr"]."""
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    script = "import json, sys\nfrom runtime import huge_pages\nresult = {}\n" \
             f"huge_pages.SETTING = {str(setting)!r}\n" + textwrap.dedent(body) + \
             "\nprint(json.dumps(result))\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return {**json.loads(done.stdout.splitlines()[-1]), "stderr": done.stderr}


@pytest.mark.skipif(not sys.platform.startswith("linux") or huge_pages.thp_setting() != "madvise",
                    reason="needs Linux with transparent huge pages set to madvise")
def test_a_resident_weight_is_moved_onto_huge_pages_with_its_values_unchanged(tmp_path):
    result = in_own_process("""
        import ctypes
        import torch

        def huge_bytes_in(start, end):
            return sum(m.get("AnonHugePages:", 0) for m in huge_pages.smaps() if m["start"] < end and m["end"] > start)

        weight = torch.randn(16 << 20)  # 64 MiB, written through: resident
        before = weight.clone()
        start = weight.data_ptr()
        end = start + weight.numel() * weight.element_size()
        result["size"], result["huge_before"] = end - start, huge_bytes_in(start, end)
        libc = huge_pages.libc()
        if libc.madvise(start // huge_pages.HUGE_PAGE * huge_pages.HUGE_PAGE, huge_pages.HUGE_PAGE,
                        huge_pages.MADV_COLLAPSE) != 0 and ctypes.get_errno() == 22:
            result["skip"] = "this kernel has no MADV_COLLAPSE (Linux 6.1 and later)"
        else:
            huge_pages._collapse_all(libc)
            result["huge_after"], result["unchanged"] = huge_bytes_in(start, end), torch.equal(weight, before)
    """, tmp_path)
    if "skip" in result:
        pytest.skip(result["skip"])
    assert result["huge_before"] == 0
    assert result["huge_after"] >= result["size"] - 2 * huge_pages.HUGE_PAGE
    assert result["unchanged"]


@pytest.mark.parametrize("text, setting", [
    ("always [madvise] never\n", "madvise"), ("[always] madvise never\n", "always"),
    ("always madvise [never]\n", "never"), ("", None), ("[]", None), ("garbage", None)])
def test_the_kernel_setting_is_read_and_anything_odd_means_none(tmp_path, monkeypatch, text, setting):
    path = tmp_path / "enabled"
    path.write_text(text)
    monkeypatch.setattr(huge_pages, "SETTING", str(path))
    assert huge_pages.thp_setting() == setting


@pytest.mark.parametrize("text, says", [
    ("[always] madvise never", "already"), ("always madvise [never]", "small pages (transparent huge pages: never)"),
    ("", "small pages (transparent huge pages: not available)")])
def test_without_madvise_nothing_is_started_and_the_line_says_why(tmp_path, monkeypatch, text, says):
    path = tmp_path / "enabled"
    path.write_text(text)
    monkeypatch.setattr(huge_pages, "SETTING", str(path))
    monkeypatch.setattr(huge_pages, "_thread", None)
    assert says in huge_pages.collapse_in_background()
    assert huge_pages._thread is None


def test_an_unreadable_setting_means_none(tmp_path, monkeypatch):
    monkeypatch.setattr(huge_pages, "SETTING", str(tmp_path / "missing"))
    assert huge_pages.thp_setting() is None


@linux
def test_settled_waits_for_the_pass_asked_for_and_an_unreadable_proc_loses_nothing(tmp_path):
    result = in_own_process("""
        passes = []

        def unreadable(libc):
            passes.append(1)
            raise PermissionError("/proc/self/smaps: permission denied")
        huge_pages._collapse_all = unreadable
        result["settled"] = []
        for _ in range(2):
            huge_pages.collapse_in_background()
            result["settled"].append((huge_pages.settled(timeout=30), len(passes)))
    """, tmp_path)
    assert result["settled"][0][0] and result["settled"][0][1] >= 1
    assert result["settled"][1][0] and result["settled"][1][1] >= 2


@linux
def test_any_failure_of_a_pass_ends_it_with_one_warning_and_settled_turns_true(tmp_path):
    """Issue 54: an error other than OSError killed the thread with a traceback, and settled() never turned true."""
    result = in_own_process("""
        failures = iter([ValueError("a mapping changed under the pass"), KeyError("Rss:"), RuntimeError()])

        def failing(libc):
            raise next(failures)
        huge_pages._collapse_all = failing
        result["settled"] = []
        for _ in range(3):  # the thread outlives each failure: a later pass runs, and fails alone too
            huge_pages.collapse_in_background()
            result["settled"].append(huge_pages.settled(timeout=30))
    """, tmp_path)
    assert result["settled"] == [True, True, True]
    lines = result["stderr"].splitlines()
    assert lines == ["huge pages: the pass stopped (ValueError: a mapping changed under the pass); the weights stay "
                     "on the pages they have",
                     "huge pages: the pass stopped (KeyError: 'Rss:'); the weights stay on the pages they have",
                     "huge pages: the pass stopped (RuntimeError: no message); the weights stay on the pages they "
                     "have"]
