// Small helpers shared by the store's translation units (store.cpp, snapshot.cpp, query.cpp).
#pragma once
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace memkern {

// Wall-clock seconds since the epoch (record timestamps, fsync intervals).
inline double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  return out;
}

inline void remove_tree(const std::string& dir) {  // one level deep: snapshot directories hold files only
  for (const auto& n : list_dir(dir)) ::unlink((dir + "/" + n).c_str());
  ::rmdir(dir.c_str());
}

// A number for an error message ("%.3g").
inline std::string num(double x) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.3g", x);
  return b;
}

}  // namespace memkern
