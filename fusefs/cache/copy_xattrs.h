// The names of the extended attributes stagefs's copies carry: the source version and CRC a
// copy was made from, and its chunks' CRCs (stage::CopyXattrs, bcast/io/store.h). The engine
// records under whatever names its user gives; these are the one pair both tools give: the
// mount's cache (NodeCache, the daemon) and stage-bcast (tools/stage_bcast.cc). Changing them
// makes every existing copy look unrecorded (copied again, never a seed).
#pragma once

#include "bcast/io/store.h"

namespace stagefs {

inline const stage::CopyXattrs kCopyXattrs{"user.stagefs.origin", "user.stagefs.chunks"};

}  // namespace stagefs
