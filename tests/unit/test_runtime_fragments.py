"""Runtime handlers a runtime installer adds while the agent runs, pure: a fragment
in ``runtimes_dir`` declares a handler beside containerd's configuration (which
wins where both name one), a shim's own options file (``ConfigPath``) goes with
its handler and to containerd as CRI hands it, and the agent's periodic
rediscovery publishes a handler that appears or goes, on a fake clock."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from sandlot.adapters.containerd.containers import RUNSC_OPTIONS_TYPE, runtime_options
from sandlot.agent.runtimes import RuntimeClasses, discover
from sandlot.policy.runtimeclass import Discovery, RuntimeHandler

V3 = "io.containerd.cri.v1.runtime"
GVISOR_FRAGMENT = f"""\
version = 3
[plugins."{V3}".containerd.runtimes.gvisor]
  runtime_type = "io.containerd.runsc.v1"
  runtime_path = "/var/lib/sandlot/runtimes/gvisor/bin/containerd-shim-runsc-v1"
[plugins."{V3}".containerd.runtimes.gvisor.options]
  TypeUrl = "io.containerd.runsc.v1.options"
  ConfigPath = "/var/lib/sandlot/runtimes/gvisor/runsc.toml"
"""


def everything(_binary: str) -> bool:
    return True


def test_a_fragment_adds_a_handler_with_its_shim_path_and_options_file(tmp_path: Path) -> None:
    fragments = tmp_path / "conf.d"
    fragments.mkdir()
    (fragments / "gvisor.toml").write_text(GVISOR_FRAGMENT)
    (fragments / "notes.txt").write_text("not a fragment")
    found = discover(str(tmp_path / "absent.toml"), str(fragments), everything)
    assert found.names == ("runc", "gvisor")
    gvisor = found.get("gvisor")
    assert gvisor == RuntimeHandler(
        "gvisor",
        "io.containerd.runsc.v1",
        "",
        "/var/lib/sandlot/runtimes/gvisor/bin/containerd-shim-runsc-v1",
        "/var/lib/sandlot/runtimes/gvisor/runsc.toml",
    )
    assert gvisor.shim == gvisor.runtime_path
    # Without the fragments directory (or with none in it), runc alone.
    assert discover(str(tmp_path / "absent.toml"), "", everything).names == ("runc",)
    assert discover(str(tmp_path / "absent.toml"), str(tmp_path / "no"), everything).names == (
        "runc",
    )


def test_a_fragment_whose_shim_is_missing_offers_nothing(tmp_path: Path) -> None:
    (tmp_path / "gvisor.toml").write_text(GVISOR_FRAGMENT)
    found = discover(str(tmp_path / "absent.toml"), str(tmp_path), lambda _b: False)
    assert found.names == ("runc",)
    assert found.skipped and found.skipped[0][0] == "gvisor"


def test_containerd_s_configuration_wins_over_a_fragment_and_a_bad_fragment_is_left_out(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        f'version = 3\n[plugins."{V3}".containerd.runtimes.gvisor]\n'
        '  runtime_type = "io.containerd.runsc.v1"\n  runtime_path = "/usr/bin/shim"\n'
    )
    fragments = tmp_path / "conf.d"
    fragments.mkdir()
    (fragments / "a.toml").write_text("version = [")
    (fragments / "gvisor.toml").write_text(GVISOR_FRAGMENT)
    found = discover(str(config), str(fragments), everything)
    assert found.get("gvisor") == RuntimeHandler(
        "gvisor", "io.containerd.runsc.v1", "", "/usr/bin/shim", ""
    )


def test_the_shim_options_are_containerd_s_runtimeoptions_message() -> None:
    """Decoded with the message's own schema (runtimeoptions.v1.Options: type_url = 1,
    config_path = 2), as containerd and the runsc shim read it; a long path too."""
    proto = descriptor_pb2.FileDescriptorProto(name="ro.proto", package="runtimeoptions.v1")
    message = proto.message_type.add(name="Options")
    for number, name in ((1, "type_url"), (2, "config_path")):
        message.field.add(
            name=name,
            number=number,
            type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
            label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    options = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("runtimeoptions.v1.Options")
    )
    path = "/var/lib/sandlot/runtimes/" + "x" * 300 + "/runsc.toml"
    decoded = options.FromString(runtime_options(path))
    assert (decoded.type_url, decoded.config_path) == (RUNSC_OPTIONS_TYPE, path)


def test_the_agent_publishes_a_handler_installed_or_removed_while_it_runs() -> None:
    now = [0.0]
    offered = [Discovery((RuntimeHandler("runc"),))]
    published: list[tuple[str, ...]] = []
    failing = [False]

    def publish(found: Discovery) -> None:
        if failing[0]:
            raise OSError("API server down")
        published.append(found.names)

    classes = RuntimeClasses(
        lambda _name: None,
        "n1",
        offered[0],
        clock=lambda: now[0],
        rediscover=lambda: offered[0],
        publish=publish,
        refresh_interval=10.0,
    )
    gvisor = RuntimeHandler("gvisor", "io.containerd.runsc.v1", "", "/s", "/c")
    offered[0] = Discovery((RuntimeHandler("runc"), gvisor))
    now[0] = 9.9
    assert not classes.refresh() and classes.discovery.names == ("runc",)
    now[0] = 10.0
    assert classes.refresh()
    assert classes.discovery.get("gvisor") == gvisor and published == [("runc", "gvisor")]
    now[0] = 15.0
    classes.survey({}, [])  # a sync pass within the interval discovers nothing
    assert published == [("runc", "gvisor")]
    # Removed while the API server is down: published once it answers.
    offered[0] = Discovery((RuntimeHandler("runc"),))
    failing[0] = True
    now[0] = 20.0
    assert classes.refresh() and published == [("runc", "gvisor")]
    failing[0] = False
    now[0] = 30.0
    assert not classes.refresh() and published == [("runc", "gvisor"), ("runc",)]
    now[0] = 40.0
    assert not classes.refresh() and published == [("runc", "gvisor"), ("runc",)]
