// --config FILE and --print-config (see config_file.h).
#include "config_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include <fmt/format.h>

namespace ringtrain::app {

void add_config_flags(CLI::App& app, ConfigFlags& flags) {
  app.set_config("--config", "",
                 "Read flags from this TOML file (key = value, the flag's name without --; "
                 "mnist_train --print-config writes one); flags on the command line override it")
      ->check(CLI::ExistingFile);
  // check_config_file names the unknown key; CLI11's own refusal makes sure none is ignored.
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.add_flag("--print-config", flags.print_config,
               "Print the effective configuration (TOML: the flags given, and every other flag "
               "as a comment with its default) and exit")
      ->configurable(false);
}

namespace {

// One key of the file, given alone to a fresh copy of the flags: the error CLI11 raises for it
// ("" if none).
std::string check_key(const CLI::ConfigItem& item) {
  CLI::App probe;
  Options scratch;
  add_flags(probe, scratch);
  ConfigFlags scratch_flags;
  add_config_flags(probe, scratch_flags);
  const CLI::Option* option =
      item.parents.empty() ? probe.get_option_no_throw("--" + item.name) : nullptr;
  if (option == nullptr)
    return fmt::format(
        "unknown key '{}': it is no flag of mnist_train (keys are the flags' names "
        "without the leading --, at the top level; mnist_train --help lists them)",
        item.fullname());
  if (!option->get_configurable())
    return fmt::format("key '{}' cannot be set in a configuration file", item.name);
  std::vector<std::string> args;  // CLI11 parses a vector from its back
  if (option->get_expected_min() == 0) {
    args.push_back(
        fmt::format("--{}={}", item.name, item.inputs.empty() ? "true" : item.inputs[0]));
  } else {
    args.push_back("--" + item.name);
    args.insert(args.end(), item.inputs.begin(), item.inputs.end());
  }
  std::reverse(args.begin(), args.end());
  try {
    probe.parse(args);
  } catch (const CLI::ParseError& error) {
    return fmt::format("key '{}': {}", item.name, error.what());
  }
  return "";
}

}  // namespace

std::string config_path(const CLI::App& app) {
  const CLI::Option* config = app.get_config_ptr();
  return config == nullptr || config->results().empty() ? "" : config->results().front();
}

std::string check_config_file(const CLI::App& app) {
  const std::string path = config_path(app);
  if (path.empty()) return "";
  std::ifstream in(path);
  if (!in) return fmt::format("--config {}: cannot be read: {}", path, std::strerror(errno));
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_config(in);
  } catch (const CLI::ParseError& error) {
    return fmt::format("--config {}: {}", path, error.what());
  }
  for (const CLI::ConfigItem& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // a [section]'s start and end
    const std::string problem = check_key(item);
    if (!problem.empty()) return fmt::format("--config {}: {}", path, problem);
  }
  return "";
}

std::string effective_config(CLI::App& app) {
  std::string text =
      "# mnist_train configuration (--print-config; run it with --config FILE). Flags that were\n"
      "# given are set; every other flag is a comment with its default.\n";
  for (CLI::Option* option : app.get_options()) {
    if (!option->get_configurable() || option->get_lnames().empty()) continue;
    const std::string& name = option->get_lnames().front();
    if (option->count() > 0) {
      text +=
          fmt::format("{} = {}\n", name,
                      CLI::detail::ini_join(option->reduced_results(), ',', '[', ']', '"', '\''));
      continue;
    }
    option->capture_default_str();  // the bound value, not yet changed: the default
    std::string value = option->get_default_str();
    if (value.empty())
      value = option->get_expected_min() == 0 ? "false" : "\"\"";
    else if (value.front() != '[')  // a list's default is written as a TOML array already
      value = CLI::detail::convert_arg_for_ini(value, '"', '\'');
    text += fmt::format("# {} = {}\n", name, value);
  }
  return text;
}

void write_config_record(MetricsWriter& metrics, const Options& o) {
  metrics.write("config", {{"config", o.effective_config}});
}

}  // namespace ringtrain::app
