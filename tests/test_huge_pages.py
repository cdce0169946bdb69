import ctypes
import sys

import pytest
import torch

from runtime import huge_pages


def _huge_bytes_in(start: int, end: int) -> int:
    return sum(m.get("AnonHugePages:", 0) for m in huge_pages.smaps() if m["start"] < end and m["end"] > start)


@pytest.mark.skipif(not sys.platform.startswith("linux") or huge_pages.thp_setting() != "madvise",
                    reason="needs Linux with transparent huge pages set to madvise")
def test_a_resident_weight_is_moved_onto_huge_pages_with_its_values_unchanged():
    weight = torch.randn(16 << 20)  # 64 MiB, written through: resident
    before = weight.clone()
    start = weight.data_ptr()
    end = start + weight.numel() * weight.element_size()
    assert _huge_bytes_in(start, end) == 0
    libc = huge_pages.libc()
    if libc.madvise(start // huge_pages.HUGE_PAGE * huge_pages.HUGE_PAGE, huge_pages.HUGE_PAGE,
                    huge_pages.MADV_COLLAPSE) != 0 and ctypes.get_errno() == 22:
        pytest.skip("this kernel has no MADV_COLLAPSE (Linux 6.1 and later)")
    huge_pages._collapse_all(libc)
    assert _huge_bytes_in(start, end) >= (end - start) - 2 * huge_pages.HUGE_PAGE
    assert torch.equal(weight, before)


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


def test_settled_waits_for_the_pass_asked_for_and_an_unreadable_proc_loses_nothing(monkeypatch):
    if not sys.platform.startswith("linux") or huge_pages.thp_setting() != "madvise":
        pytest.skip("needs Linux with transparent huge pages set to madvise")
    passes = []

    def unreadable(libc):
        passes.append(1)
        raise PermissionError("/proc/self/smaps: permission denied")
    monkeypatch.setattr(huge_pages, "_collapse_all", unreadable)
    for expected in (1, 2):
        huge_pages.collapse_in_background()
        assert huge_pages.settled(timeout=30)
        assert len(passes) >= expected
