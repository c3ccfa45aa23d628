// Human and machine reports of a transfer (mpi-stage's timing table, JSON). Used by
// stage-bcast (bcast/job/job.h); its progress line is bcast/text/progress.h.
#pragma once

#include <string>

#include "bcast/text/progress.h"
#include "bcast/transfer/terms.h"

namespace stage {

std::string report_table(const StageReport& r, const std::string& source, const std::string& dest);
std::string report_json(const StageReport& r, const std::string& source, const std::string& dest, int ranks);
std::string json_escape(const std::string& s);

}  // namespace stage
