// The names of a store's temporary copies: ".<name>.stage-tmp.<host>.<pid>" beside the
// destination (store.h's Txn writes there, then renames). The source's scan skips files named
// so (their copies would be a neighbour's temporary file), the store clears those of dead
// writers, and the mount's cache hides them. Pure functions but for the host name and pid.
#pragma once

#include <string>
#include <string_view>

namespace stage {

// The temporary name for a copy of path: beside it, unique to this host and process, at most
// 190 bytes long whatever path's last component (a long one is cut and tagged with its CRC).
std::string temp_name_for(const std::string& path);
// True for a name temp_name_for() could have given (any host, any process).
bool is_temp_name(std::string_view name);
// The process id of a temporary name this host gave, or 0 for any other name.
long temp_name_pid(std::string_view name);
// The directory part of path ("." for a bare name, "/" for a name in the root).
std::string parent_dir(const std::string& path);

}  // namespace stage
