// SPDX-License-Identifier: Apache-2.0
// The logistic regression the training examples share: a data set generated from a fixed
// seed (identical on every rank), the model, its loss gradient and SGD step, and each
// epoch's visiting order. See 02_data_parallel/main.cpp for how the examples use it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

namespace example {

constexpr std::size_t samples = 8192;
constexpr std::size_t features = 32;
constexpr std::size_t global_batch = 256;
constexpr int epochs = 20;
constexpr double learning_rate = 0.5;
constexpr double label_noise = 0.05;
constexpr std::uint64_t seed = 20240611;
constexpr double tolerance = 1e-5;  // on the relative difference of the epoch losses

/// splitmix64: the same numbers on every platform and standard library, which
/// std::normal_distribution does not promise.
class rng {
 public:
  explicit rng(std::uint64_t s) : state_(s) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {  // Box-Muller
    const double u1 = 1.0 - uniform();  // (0, 1]: log is finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::uint64_t state_;
};

struct data_set {
  std::vector<double> x;  // samples x features, row-major
  std::vector<double> y;  // 0 or 1
  std::span<const double> row(std::size_t i) const {
    return std::span<const double>(x).subspan(i * features, features);
  }
};

data_set make_data() {
  rng g(seed);
  std::vector<double> rule(features);
  for (double& w : rule) w = g.normal();
  const double rule_bias = 0.5;
  data_set d{std::vector<double>(samples * features), std::vector<double>(samples)};
  for (std::size_t i = 0; i < samples; ++i) {
    double z = rule_bias;
    for (std::size_t k = 0; k < features; ++k) {
      d.x[i * features + k] = g.normal();
      z += rule[k] * d.x[i * features + k];
    }
    const bool flip = g.uniform() < label_noise;
    d.y[i] = (z > 0) != flip ? 1.0 : 0.0;
  }
  return d;
}

/// Weights, then the bias as element `features`.
using model = std::vector<double>;

double logit(const model& m, std::span<const double> x) {
  double z = m[features];
  for (std::size_t k = 0; k < features; ++k) z += m[k] * x[k];
  return z;
}

/// Adds sample i's loss gradient to grad[0, features] and returns its loss,
/// log(1 + e^z) - y z, written so that no large |z| overflows.
double add_gradient(const model& m, const data_set& d, std::size_t i, std::span<double> grad) {
  const std::span<const double> x = d.row(i);
  const double z = logit(m, x);
  const double p = 1.0 / (1.0 + std::exp(-z));
  const double g = p - d.y[i];
  for (std::size_t k = 0; k < features; ++k) grad[k] += g * x[k];
  grad[features] += g;
  return std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z))) - d.y[i] * z;
}

void sgd_step(model& m, std::span<const double> grad_sum, double count) {
  for (std::size_t k = 0; k <= features; ++k) m[k] -= learning_rate * grad_sum[k] / count;
}

/// The visiting order of an epoch: the same on every rank.
std::vector<std::size_t> epoch_order(int epoch) {
  std::vector<std::size_t> order(samples);
  std::iota(order.begin(), order.end(), std::size_t{0});
  rng g(seed + 1 + static_cast<std::uint64_t>(epoch));
  for (std::size_t i = samples - 1; i > 0; --i) {  // Fisher-Yates
    std::swap(order[i], order[g.next() % (i + 1)]);
  }
  return order;
}

std::size_t correct(const model& m, const data_set& d, std::size_t begin, std::size_t end) {
  std::size_t n = 0;
  for (std::size_t i = begin; i < end; ++i) {
    if ((logit(m, d.row(i)) > 0) == (d.y[i] > 0.5)) ++n;
  }
  return n;
}

}  // namespace example
