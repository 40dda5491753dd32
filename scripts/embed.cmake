# embed.cmake: a file as a C array, for a file the binary serves (the web
# page); run at build time by CMakeLists.txt whenever the file changes.
#
#   cmake -DIN=FILE -DOUT=FILE.c -DNAME=SYMBOL -P scripts/embed.cmake
#
# FILE.c defines `const char SYMBOL[]` (the bytes and a NUL) and
# `const size_t SYMBOL_len` (the bytes without it).
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" digits)
math(EXPR bytes "${digits} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n" body "${body}")
get_filename_component(name "${IN}" NAME)
file(WRITE "${OUT}" "/* ${name} as a C array, written by scripts/embed.cmake at build time. */\n"
                    "#include <stddef.h>\n\nconst char ${NAME}[] = {\n${body}0};\n"
                    "const size_t ${NAME}_len = ${bytes};\n")
