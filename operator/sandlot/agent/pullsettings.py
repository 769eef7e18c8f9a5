"""The agent's settings for image pulls: deadlines and back-off, registries'
configuration and credentials, which images a credential may use, and where a
registry request may go. Part of ``AgentSettings``, whose flags and environment
variables they keep (``--image-pull-workers``, ``SANDLOT_IMAGE_PULL_WORKERS``)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, field_validator

from sandlot.api.sandbox import Quantity
from sandlot.api.settings import PositiveDuration, SettingsModel
from sandlot.policy.pulling import VerifyPolicy
from sandlot.policy.quantity import parse_quantity


class PullSettings(SettingsModel):
    image_pull_deadline: PositiveDuration = Field(
        default=timedelta(minutes=10),
        description="Longest an image pull may take in all (resolve, every blob, unpack).",
    )
    image_pull_stall_timeout: PositiveDuration = Field(
        default=timedelta(seconds=30),
        description="A registry read that gets no byte for this long fails the pull "
        "(a registry that stalls mid-blob), which is then retried after its back-off.",
    )
    image_pull_backoff: PositiveDuration = Field(
        default=timedelta(seconds=10),
        description="Wait after a failed image pull before the next; it doubles with each "
        "failure in a row (the kubelet's ImagePullBackOff).",
    )
    image_pull_max_backoff: PositiveDuration = Field(
        default=timedelta(minutes=5),
        description="Cap of the doubling wait between image pull retries.",
    )
    image_pull_workers: int = Field(
        default=2,
        ge=1,
        le=16,
        description="Image pulls running at once (each image is pulled once however many "
        "sandboxes want it).",
    )
    registry_config_dir: str = Field(
        default="",
        description="Directory of per-registry hosts.toml files (containerd's conventions: "
        "mirrors, private CAs, plain-HTTP registries); empty: none.",
    )
    registry_auth_file: str = Field(
        default="",
        description="A .dockerconfigjson file with the node-wide default registry "
        "credentials (used when a sandbox's own pull secrets name no credential for its "
        "registry); empty: none.",
    )
    image_pull_credentials_verification_policy: VerifyPolicy = Field(
        default=VerifyPolicy.NEVER_VERIFY_PRELOADED,
        description="Which images the node has run for a sandbox only after its own "
        "credential (or anonymous access) is verified against the registry, as the "
        "kubelet's imagePullCredentialsVerificationPolicy: NeverVerify, "
        "NeverVerifyPreloadedImages (images the agent pulled), NeverVerifyAllowlistedImages "
        "(all but preloaded images on the allowlist), AlwaysVerify.",
    )
    preloaded_images_verification_allowlist: list[str] = Field(
        default_factory=list,
        description="Repositories (registry/path, or a prefix registry/path/*) whose "
        "preloaded images run unverified under NeverVerifyAllowlistedImages (repeatable).",
    )
    registry_private_hosts: list[str] = Field(
        default_factory=list,
        description="Registry and token-realm hosts (name or name:port) that may resolve to "
        "loopback, link-local, unspecified or the node's own addresses; any other host "
        "there is refused, checked on every connection (repeatable).",
    )
    registry_redirect_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts (name or name:port) besides the registry's own that its "
        "redirects may go to, such as its blob storage; credentials are never sent there "
        "(repeatable).",
    )
    suspend_state_repository: str = Field(
        default="",
        description="A registry repository (registry/path) a suspended sandbox's committed "
        "filesystem is pushed to, tagged with its uid, so that any node may start it "
        "again (a drain may move it); empty: the state stays on its node.",
    )
    suspend_state_auth_file: str = Field(
        default="",
        description="A .dockerconfigjson file with the credential for "
        "suspend_state_repository's registry (the chart mounts it from one Secret); used "
        "for that repository only, never for a sandbox's image; empty: anonymous.",
    )
    image_pull_by_daemon: bool = Field(
        default=False,
        description="Let containerd 2.x's Transfer service pull when it can: the daemon then "
        "follows redirects and reaches addresses itself, outside the registry_* limits; "
        "false pulls client-side under them.",
    )
    image_max_unpacked_layer: Quantity = Field(
        default="16Gi",
        description="Most bytes one image layer may unpack to (its tar decompressed, sparse "
        "files at their full size), counted as the layer is fetched: past it the pull stops "
        "before the layer is applied and the sandbox fails ImageTooLarge, naming the cap. "
        "Not counted when containerd pulls (image_pull_by_daemon).",
    )
    image_max_unpacked: Quantity = Field(
        default="32Gi",
        description="Most bytes all the layers one image pull unpacks may add up to, "
        "counted the same way; layers already on the node are not counted again.",
    )

    @field_validator("image_max_unpacked_layer", "image_max_unpacked")
    @classmethod
    def _a_positive_size(cls, value: str) -> str:
        if parse_quantity(value) < 1:
            raise ValueError(f"{value!r} must be a positive number of bytes")
        return value

    def unpacked_caps(self) -> dict[str, int]:
        """The caps as ``ContainerdPuller``'s options, in bytes."""
        return {
            "max_unpacked_layer": int(parse_quantity(self.image_max_unpacked_layer)),
            "max_unpacked": int(parse_quantity(self.image_max_unpacked)),
        }
