"""examples/record_video.py checks its arguments, its output folder and its MP4 writer before the
policy is loaded or the rollout runs (writing the video is tested with a trained run in
tests/test_policy.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agents.tools import record_video  # noqa: E402


@pytest.mark.parametrize("fps", ["-1", "0", "1000"])
def test_a_bad_fps_is_a_usage_error_before_anything_runs(tmp_path, capsys, fps):
    """--fps -1 used to fail with an OverflowError after the whole rollout."""
    with pytest.raises(SystemExit) as e:
        record_video.main([str(tmp_path / "no_run"), "drink water", "--fps", fps, "--out", str(tmp_path / "v.gif")])
    assert e.value.code == 2 and f"--fps {fps} must be in [1, 100]" in capsys.readouterr().err
    with pytest.raises(ValueError, match=rf"--fps={fps} must be an integer >= 1 and <= 100"):
        record_video.record(tmp_path / "no_run", "drink water", tmp_path / "v.gif", fps=int(fps))


def test_an_output_folder_that_does_not_exist_is_refused_and_not_created(tmp_path, capsys):
    """--out /new/dir/v.gif used to create the folder (after the rollout)."""
    out = tmp_path / "new" / "dir" / "v.gif"
    assert record_video.main([str(tmp_path / "no_run"), "drink water", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"the folder {out.parent} does not exist" in err and "no_run" not in err
    assert not (tmp_path / "new").exists()


def test_an_mp4_without_its_writer_is_refused_before_the_policy_is_loaded(tmp_path, capsys, monkeypatch):
    # where imageio's ffmpeg plugin is installed (the `video` extra), a None entry in sys.modules makes
    # importing it fail as on a machine without it
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    assert record_video.main([str(tmp_path / "no_run"), "drink water", "--out", str(tmp_path / "v.mp4")]) == 2
    err = capsys.readouterr().err
    assert "writing an MP4 needs imageio and its ffmpeg plugin: pip install 'oir-gym[video]'" in err
    assert "no_run" not in err  # refused before the run directory was even read
