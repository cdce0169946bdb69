"""What storage/folder.py does to the files themselves, written with plain writers (no model): their modes, a
copy made of hard links, the record of what a folder holds, the errors a save or a lock can meet."""
import errno
import fcntl
import json
import os
import re
from pathlib import Path

import pytest

from storage.folder import (CONTENTS_FILE, STAGING_DIR, WRITER_LOCK, DiskFull, FolderBusy, FolderError,
                            UntrustedName, acquire_writer_lock, holds_writer_lock, previous_contents, reading,
                            release_writer_lock, remove_files, write_folder_atomically)


def text_writer(text: str):
    return lambda path: path.write_text(text)


def save(folder, **files: str) -> None:
    write_folder_atomically(folder, {name.replace("__", "/"): text_writer(text) for name, text in files.items()})


def current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_saved_files_have_the_mode_any_file_the_user_writes_gets(tmp_path):
    save(tmp_path / "f", a="1")
    assert (tmp_path / "f" / "a").stat().st_mode & 0o777 == 0o666 & ~current_umask()
    assert (tmp_path / "f" / WRITER_LOCK).stat().st_mode & 0o777 == 0o644 & ~current_umask()


def test_a_folder_never_written_by_these_tools_is_read_as_it_is(tmp_path):
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "config.json").write_text("{}")  # a model folder from elsewhere: no lock files
    with reading(tmp_path / "f"):
        assert sorted(p.name for p in (tmp_path / "f").iterdir()) == ["config.json"]


def test_a_folder_that_is_a_symlink_loop_is_one_error_naming_it(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(FolderError, match=f"^{tmp_path / 'loop'} cannot be used as a folder: .*; remove the link"):
        acquire_writer_lock(tmp_path / "loop")


def test_a_writer_lock_shared_by_hard_link_with_another_folder_is_never_written_through(tmp_path):
    first, copy = tmp_path / "first", tmp_path / "copy"
    save(first, a="1")
    copy.mkdir()
    os.link(first / WRITER_LOCK, copy / WRITER_LOCK)  # `cp -al first copy`, as far as the lock goes
    recorded = (first / WRITER_LOCK).read_text()
    acquire_writer_lock(copy)
    try:
        assert os.stat(copy / WRITER_LOCK).st_nlink == 1
        assert os.stat(copy / WRITER_LOCK).st_mode & 0o777 == 0o644 & ~current_umask()
        assert json.loads((copy / WRITER_LOCK).read_text())["pid"] == os.getpid()
    finally:
        release_writer_lock(copy)
    assert (first / WRITER_LOCK).read_text() == recorded and os.stat(first / WRITER_LOCK).st_nlink == 1


@pytest.mark.parametrize("record", ["not json", "[1]", "{}", "[" * 100_000])
def test_a_busy_folder_whose_lock_file_holds_no_record_names_another_process(tmp_path, record):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / WRITER_LOCK).write_text(record)
    fd = os.open(folder / WRITER_LOCK, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another open file: flock treats it as another process
    try:
        with pytest.raises(FolderBusy, match=f"^{folder} is being written by another process; wait"):
            acquire_writer_lock(folder)
    finally:
        os.close(fd)


def test_a_relative_folder_under_a_deleted_working_folder_is_one_error_naming_it(tmp_path, monkeypatch):
    (tmp_path / "gone").mkdir()
    monkeypatch.chdir(tmp_path / "gone")  # restored after the test
    (tmp_path / "gone").rmdir()
    with pytest.raises(FolderError, match="^out cannot be used as a folder: .*; remove the link or choose another"):
        acquire_writer_lock("out")


def test_the_lock_records_the_writer_s_command_cut_to_300_characters(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["train.py", "x" * 1000])
    acquire_writer_lock(tmp_path / "f")
    try:
        record = json.loads((tmp_path / "f" / WRITER_LOCK).read_text())
    finally:
        release_writer_lock(tmp_path / "f")
    assert record["command"] == ("python train.py " + "x" * 1000)[:300]


def test_a_folder_that_cannot_be_made_is_one_line_with_the_system_s_reason(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(FolderError) as error:
        acquire_writer_lock(tmp_path / "file" / "f")
    assert str(error.value) == (f"cannot write to {tmp_path / 'file' / 'f'}: Not a directory; choose another output "
                                f"folder")


def test_contents_record_every_file_of_every_save_without_overwrite(tmp_path):
    folder = tmp_path / "f"
    save(folder, a="1", b="1")
    save(folder, a="2", sub__deeper__c="2")
    assert previous_contents(folder) == ["a", "b", "sub/deeper/c"]
    assert (folder / "sub" / "deeper" / "c").read_text() == "2"


@pytest.mark.parametrize("kind", ["dotdot landing inside", "absolute inside", "empty", "nul", "number", "loop"])
def test_a_recorded_name_that_is_not_a_plain_relative_path_is_refused(tmp_path, kind):
    folder = tmp_path / "f"
    save(folder, a="1")
    (folder / "loop").symlink_to(folder / "loop")
    name = {"dotdot landing inside": "sub/../a", "absolute inside": str(folder / "a"), "empty": "", "nul": "a\0b",
            "number": 5, "loop": "loop/a"}[kind]
    (folder / CONTENTS_FILE).write_text(json.dumps([name]))
    with pytest.raises(UntrustedName, match=f"lists {re.escape(repr(name))}, which is not a file inside {folder}"):
        previous_contents(folder)
    assert (folder / "a").read_text() == "1"


def test_removing_files_already_gone_by_hand_removes_the_rest(tmp_path):
    folder = tmp_path / "f"
    save(folder, a="1", sub__b="1")
    (folder / "a").unlink()
    (folder / "sub" / "kept").write_text("not the save's")
    acquire_writer_lock(folder)
    try:
        remove_files(folder, previous_contents(folder))
        assert sorted(p.name for p in (folder / "sub").iterdir()) == ["kept"]
        assert not (folder / CONTENTS_FILE).exists()
        remove_files(folder, [])  # a folder with no record left: nothing to do, no error
    finally:
        release_writer_lock(folder)
    assert folder.is_dir()


def test_a_save_the_reader_cannot_finish_is_named_with_how_to_finish_it(tmp_path):
    folder = tmp_path / "f"
    save(folder, a="1")
    (folder / STAGING_DIR).mkdir()
    (folder / STAGING_DIR / "COMPLETE").write_text(json.dumps(["a"]))
    (folder / WRITER_LOCK).unlink()
    (folder / WRITER_LOCK).mkdir()  # the writer lock cannot be opened: the stand-in writer cannot take it
    with pytest.raises(FolderError, match="holds a save that was interrupted while being moved into place, and this "
                                          "process cannot finish it"):
        with reading(folder):
            pass


def test_a_writer_s_own_reading_of_its_folder_keeps_its_lock(tmp_path):
    folder = tmp_path / "f"
    save(folder, a="1")
    acquire_writer_lock(folder)
    try:
        (folder / STAGING_DIR).mkdir()
        (folder / STAGING_DIR / "COMPLETE").write_text(json.dumps(["a"]))  # its own save, being moved in
        with reading(folder):
            pass
        assert holds_writer_lock(folder)
    finally:
        release_writer_lock(folder)


def test_a_reader_leaves_a_save_without_a_journal_to_the_next_writer(tmp_path):
    folder = tmp_path / "f"
    save(folder, a="1")
    (folder / STAGING_DIR).mkdir()
    (folder / STAGING_DIR / "a").write_text("half")  # a writer killed while staging: no journal, no lock
    with reading(folder):
        assert (folder / "a").read_text() == "1"
    assert (folder / STAGING_DIR / "a").read_text() == "half" and not holds_writer_lock(folder)


def test_a_full_disk_before_anything_is_staged_is_one_disk_full_line(tmp_path, monkeypatch):
    folder = tmp_path / "f"
    save(folder, a="1")
    make_folder = Path.mkdir

    def full_at_staging(path, *args, **kwargs):
        if path.name == STAGING_DIR:
            raise OSError(errno.ENOSPC, "No space left on device")
        return make_folder(path, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", full_at_staging)
    with pytest.raises(DiskFull, match=f"^the disk holding {folder} is full"):
        save(folder, a="2")
    assert (folder / "a").read_text() == "1"


def raising_in_handling(cause: OSError):
    """A writer that fails while handling `cause`: the OSError reaches the save only as the error's context."""
    def write(path):
        try:
            raise cause
        except OSError:
            raise RuntimeError("wrapped")  # no `from`: the OSError is its __context__, not its __cause__
    return write


def test_a_full_disk_seen_only_as_an_error_s_context_is_still_a_full_disk(tmp_path):
    folder = tmp_path / "f"
    save(folder, a="1")
    with pytest.raises(DiskFull):
        write_folder_atomically(folder, {"a": raising_in_handling(OSError(errno.ENOSPC, "No space left on device"))})
    assert (folder / "a").read_text() == "1"


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS])  # below and above ENOSPC's number
def test_another_os_error_during_a_save_is_not_called_a_full_disk(tmp_path, code):
    folder = tmp_path / "f"
    save(folder, a="1")
    with pytest.raises(RuntimeError, match="wrapped") as error:
        write_folder_atomically(folder, {"a": raising_in_handling(OSError(code, os.strerror(code)))})
    assert not isinstance(error.value, DiskFull)
    assert (folder / "a").read_text() == "1"
