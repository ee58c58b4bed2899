// plot_png and gnuplot_available (common/report.h): PNG line plots drawn by gnuplot from a data
// file and a script written beside the PNG.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/report.h"

namespace fogo::trainer {
namespace {

std::string gp_quote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

bool gnuplot_available() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

bool plot_png(const std::string& png_path, const std::vector<Panel>& panels, int columns) {
  return plot_png(png_path, panels, columns, std::cerr);
}

namespace {

// One gnuplot data block per series, addressed by index: columns x, y, y - sd, y + sd.
void write_plot_data(const std::string& dat, const std::vector<Panel>& panels) {
  std::ofstream data(dat);
  for (const auto& panel : panels) {
    for (const auto& s : panel.series) {
      if (s.x.size() != s.y.size() || (!s.sd.empty() && s.sd.size() != s.y.size())) {
        throw std::invalid_argument("plot_png: series '" + s.name + "' of panel '" + panel.title +
                                    "' has x, y and sd of different lengths");
      }
      data << "# " << s.name << '\n';
      for (size_t k = 0; k < s.x.size(); ++k) {
        const double sd = s.sd.empty() ? 0.0 : s.sd[k];
        data << s.x[k] << ' ' << s.y[k] << ' ' << s.y[k] - sd << ' ' << s.y[k] + sd << '\n';
      }
      // An empty series still needs its block so the indices of the later ones stay right.
      if (s.x.empty()) data << "nan nan nan nan\n";
      data << "\n\n";
    }
  }
  if (!data) throw std::runtime_error("plot_png: cannot write " + dat);
  data.close();
}

// The gnuplot script that draws the panels of `dat` into `png_path`, `cols` x `rows`.
void write_plot_script(const std::string& gp, const std::string& png_path, const std::string& dat,
                       const std::vector<Panel>& panels, int cols, int rows) {
  std::ofstream script(gp);
  script << "set terminal pngcairo size " << 560 * cols << "," << 420 * rows << " font 'sans,10'\n"
         << "set output " << gp_quote(png_path) << "\n"
         << "set style fill transparent solid 0.18 noborder\n"
         << "set key below reverse Left\nset grid\n";
  if (panels.size() > 1) script << "set multiplot layout " << rows << "," << cols << "\n";
  int index = 0;
  for (const auto& panel : panels) {
    script << "set title " << gp_quote(panel.title) << "\nset xlabel " << gp_quote(panel.xlabel)
           << "\nset ylabel " << gp_quote(panel.ylabel) << "\nplot ";
    for (size_t k = 0; k < panel.series.size(); ++k) {
      const auto& s = panel.series[k];
      const std::string src = gp_quote(dat) + " index " + std::to_string(index++);
      if (k) script << ", \\\n     ";
      if (!s.sd.empty()) {
        script << src << " using 1:3:4 with filledcurves lc " << k + 1 << " notitle, \\\n     ";
      }
      script << src << " using 1:2 with linespoints lc " << k + 1 << " lw 2 pt 7 ps 0.5 title "
             << gp_quote(s.name);
    }
    if (panel.series.empty()) script << "NaN notitle";
    script << "\n";
  }
  if (panels.size() > 1) script << "unset multiplot\n";
  if (!script) throw std::runtime_error("plot_png: cannot write " + gp);
  script.close();
}

}  // namespace

bool plot_png(const std::string& png_path, const std::vector<Panel>& panels, int columns,
              std::ostream& log) {
  if (panels.empty()) throw std::invalid_argument("plot_png: no panels for " + png_path);
  const int cols = columns > 0 ? columns : static_cast<int>(panels.size());
  const int rows = (static_cast<int>(panels.size()) + cols - 1) / cols;
  const auto parent = std::filesystem::path(png_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);

  const std::string dat = png_path + ".dat", gp = png_path + ".gp";
  write_plot_data(dat, panels);
  write_plot_script(gp, png_path, dat, panels, cols, rows);

  if (!gnuplot_available()) {
    log << "plot: gnuplot not found (Debian: gnuplot-nox); skipped " << png_path
        << " (data and script are in " << dat << ", " << gp << ")\n";
    return false;
  }
  const std::string cmd = "gnuplot " + shell_quote(gp) + " 2>" + shell_quote(gp + ".log");
  if (std::system(cmd.c_str()) != 0) {
    log << "plot: gnuplot failed on " << gp << " (see " << gp << ".log)\n";
    return false;
  }
  return true;
}

}  // namespace fogo::trainer
