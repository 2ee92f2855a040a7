"""Protobuf schemas tpudiag owns: the XSpace trace format and the few XProf/XLA payloads it reads.

The schemas are built at import time from field tables (no generated code), so they do not
depend on a protoc version and list exactly the fields tpudiag reads or writes. Unknown fields
in real files are preserved by protobuf and ignored here.
"""

from tpudiag.proto.schema import (
    CoreDetails,
    HloModuleProto,
    HloProto,
    MemoryAccessBreakdown,
    PprofProfile,
    XEvent,
    XEventMetadata,
    XLine,
    XLineHead,
    XPlane,
    XPlaneHead,
    XPlaneRawLines,
    XSpaceRawPlanes,
    XSpace,
    XStat,
    XStatMetadata,
)

__all__ = [
    "CoreDetails",
    "HloModuleProto",
    "HloProto",
    "MemoryAccessBreakdown",
    "PprofProfile",
    "XEvent",
    "XEventMetadata",
    "XLine",
    "XLineHead",
    "XPlane",
    "XPlaneHead",
    "XPlaneRawLines",
    "XSpaceRawPlanes",
    "XSpace",
    "XStat",
    "XStatMetadata",
]
