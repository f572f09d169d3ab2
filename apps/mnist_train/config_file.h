// --config FILE and --print-config: every flag of mnist_train from a TOML file (CLI11's
// ConfigTOML), and the effective configuration written back as TOML, which --print-config
// prints and the metrics file's first record holds, so that a run can be repeated from it.
//
// The one idea: a flag left out is not the same as a flag given with its default value (the
// --batch-size that --global-batch-size derives, --steps instead of --epochs), so the printed
// configuration sets exactly the flags that were given (on the command line or in the file)
// and writes every other flag as a comment with its default. Running with it means what the
// original run meant, and printing it again gives the same text.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "options.h"
#include "ringtrain/report.h"

namespace ringtrain::app {

struct ConfigFlags {
  bool print_config = false;  // --print-config
};

// Registers --config and --print-config (after add_flags): keys are the flags' names without
// the leading "--"; a command-line flag overrides the file; a key that is no flag is an error.
void add_config_flags(CLI::App& app, ConfigFlags& flags);

// The file --config named ("" without one), once app.parse has run (CLI11 reads it then).
std::string config_path(const CLI::App& app);

// After app.parse (whether it succeeded or threw): when --config named a file, each of its
// keys is checked on its own, as if given on the command line, with the same validators.
// Returns "" when every key is a flag with a valid value, else one message naming the file,
// the key and what is wrong (an unknown key, a bad value), for exit 2.
std::string check_config_file(const CLI::App& app);

// The effective configuration as TOML (see the file comment). Call right after a successful
// parse, before anything changes the options (it reads their current values as defaults).
std::string effective_config(CLI::App& app);

// The metrics file's "config" record: {"event":"config","config":"<effective_config>"}
// (scripts/metrics_config turns it back into a file for --config).
void write_config_record(MetricsWriter& metrics, const Options& o);

}  // namespace ringtrain::app
