// Names users chose, shown to people: on a terminal (stagectl, the tools' reports) or in the
// root daemon's log. A name is bytes: it may hold a carriage return or an escape sequence
// that rewrites the reader's terminal line or title, or bytes that are not UTF-8.
// Pure functions; no dependencies (stagectl links this alone).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace stage {

// Length of the well-formed UTF-8 sequence that starts at s[i] (1 for ASCII), or 0 where none
// does (a stray continuation byte, a truncated, overlong or surrogate sequence, past U+10FFFF).
size_t utf8_length(std::string_view s, size_t i);

// s with everything a terminal would act on written as \xNN, one per byte: C0 controls
// (below 0x20: newline, carriage return, ESC...), DEL, the C1 controls U+0080..U+009F in
// their UTF-8 form (U+009B is CSI on some terminals), the bidirectional embeddings,
// overrides and isolates (U+202A..U+202E, U+2066..U+2069: they reorder what is shown), and
// bytes that are not UTF-8. A backslash is written \\ so that the result reads back
// unambiguously. Other UTF-8 text is unchanged.
std::string escape_controls(std::string_view s);

}  // namespace stage
