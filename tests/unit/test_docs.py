"""Every setting and every CLI command is documented in the README."""

from pathlib import Path

from phalanx import config

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_setting_is_documented():
    for setting in config.SETTINGS:
        assert f"`{setting.env_var}`" in README, f"document {setting.key} ({setting.env_var}) in README.md"


def test_every_command_is_documented():
    import typer

    from phalanx.cli.main import app

    command = typer.main.get_command(app)
    for name in command.commands:
        assert f"phalanx {name}" in README, f"document `phalanx {name}` in README.md"
