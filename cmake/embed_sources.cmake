# Writes OUTPUT, a C++ file defining kiln::embedded_sources() with the text of every file in
# SOURCES (names relative to BASE). Run at build time, so editing a template rebuilds.
set(body "")
foreach(path IN LISTS SOURCES)
  file(READ "${path}" text)
  file(RELATIVE_PATH name "${BASE}" "${path}")
  string(APPEND body "    {\"${name}\", R\"kiln_embed(${text})kiln_embed\"},\n")
endforeach()
file(WRITE "${OUTPUT}.tmp" "// Generated from templates/kiln/*.cuh at build time. Do not edit.
#include \"templates/family.h\"

namespace kiln {

std::span<const EmbeddedSource> embedded_sources() {
  static const EmbeddedSource sources[] = {
${body}  };
  return sources;
}

}  // namespace kiln
")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
