"""The enums of Triton's `model_config.proto` that the rules compare against, as plain numbers.

Core reads a parsed `ModelConfig` but must not import `tritonclient.grpc` (its package imports
gRPC): these are the proto's enum values, which the wire format fixes forever; the unit test
`test_model_config_enums_match_the_proto` compares every one with the generated module."""

from __future__ import annotations

from collections.abc import Mapping


class ProtoEnum:
    """One proto enum: members as attributes, `Name(number)` and `values()` like protobuf's."""

    def __init__(self, name: str, members: Mapping[str, int]) -> None:
        self.name = name
        self.members = dict(members)
        self._names = {number: member for member, number in self.members.items()}
        for member, number in self.members.items():
            setattr(self, member, number)

    def Name(self, number: int) -> str:  # noqa: N802 - protobuf's spelling
        try:
            return self._names[number]
        except KeyError:
            raise ValueError(f"enum {self.name} has no value {number}") from None

    def values(self) -> list[int]:
        return list(self.members.values())


DataType = ProtoEnum("DataType", {
    "TYPE_INVALID": 0, "TYPE_BOOL": 1, "TYPE_UINT8": 2, "TYPE_UINT16": 3, "TYPE_UINT32": 4, "TYPE_UINT64": 5,
    "TYPE_INT8": 6, "TYPE_INT16": 7, "TYPE_INT32": 8, "TYPE_INT64": 9, "TYPE_FP16": 10, "TYPE_FP32": 11,
    "TYPE_FP64": 12, "TYPE_STRING": 13, "TYPE_BF16": 14,
})
InstanceKind = ProtoEnum("ModelInstanceGroup.Kind", {"KIND_AUTO": 0, "KIND_GPU": 1, "KIND_CPU": 2, "KIND_MODEL": 3})
TimeoutAction = ProtoEnum("ModelQueuePolicy.TimeoutAction", {"REJECT": 0, "DELAY": 1})
ControlKind = ProtoEnum("ModelSequenceBatching.Control.Kind", {
    "CONTROL_SEQUENCE_START": 0, "CONTROL_SEQUENCE_READY": 1, "CONTROL_SEQUENCE_END": 2, "CONTROL_SEQUENCE_CORRID": 3,
})
InputFormat = ProtoEnum("ModelInput.Format", {"FORMAT_NONE": 0, "FORMAT_NHWC": 1, "FORMAT_NCHW": 2})
BatchInputKind = ProtoEnum("BatchInput.Kind", {
    "BATCH_ELEMENT_COUNT": 0, "BATCH_ACCUMULATED_ELEMENT_COUNT": 1, "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO": 2,
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE": 3, "BATCH_ITEM_SHAPE": 4, "BATCH_ITEM_SHAPE_FLATTEN": 5,
})
BatchOutputKind = ProtoEnum("BatchOutput.Kind", {"BATCH_SCATTER_WITH_INPUT_SHAPE": 0})
