/* commands.h: the subcommands of the convoy binary. Each takes the
 * arguments after its name (argv[0] is the subcommand name), prints its
 * output to stdout and its messages to stderr, and returns the process exit
 * status (0 ok, 1 error, 2 usage). */
#ifndef CONVOY_APP_COMMANDS_H
#define CONVOY_APP_COMMANDS_H

int cmd_run(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_split(int argc, char **argv);
int cmd_stage(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
int cmd_pack(int argc, char **argv);
int cmd_unpack(int argc, char **argv);
int cmd_render_template(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_chat(int argc, char **argv);

#endif
