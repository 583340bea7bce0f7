// The order the fast search measures configs in: its first N entries are the N configs that
// best span the space around a starting point (the family's search start), so cutting the
// list at any budget still measures the start's closest rivals before far-away ones.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "templates/types.h"

namespace kiln {

// Every config of `pool` once, in this order (ties broken by `pool`'s order):
//  1. `centre` (when it is in `pool`);
//  2. its one-step neighbours at its own vector width and extras: threads_per_row x2, /2,
//     then cta_threads x2, /2;
//  3. `centre`'s shape with other extras (the family-specific tunables, such as a persistent
//     grid), fewest changes first;
//  4. at its width and extras, the threads_per_row counts strictly between its neighbours'
//     (splits that are not powers of two), nearest first;
//  5. for each other vector width in `pool`, widest first, its config nearest to `centre`
//     in (threads_per_row, cta_threads, extras): how the other widths compare at their best
//     guess;
//  6. the one-step neighbours of each config picked in 5, in the same order;
//  7. the rest, nearest to `centre` first, counting vector width as a step too.
// The family's own tunables come before narrower vectors: a memory-bound kernel seldom gains
// from narrower accesses than its data allows, and a fast budget of 8 would otherwise be
// spent on them.
// Distances count doublings: log2 ratios of each numeric tunable, plus one per extra that
// differs.
// `pool` must hold distinct configs.
std::vector<Config> order_around(const Config& centre, const std::vector<Config>& pool);

// The fast search's second round, around the first round's winner `best`: the configs of
// `pool` not in `measured`, in this order:
//  1. `best`'s shape (width, threads per row, CTA threads) with other extras, fewest
//     changes first;
//  2. `best`'s shape at the next narrower vector width in `pool`, without extras, then with
//     `best`'s (two configs);
//  3. at `best`'s width, the two nearest splits that are not powers of two (threads per row
//     above half and below four times `best`'s), in CTAs of as many rows as `best`'s;
//  4. at the narrower width, the same row split: threads per row scaled up by the width
//     ratio (the same elements per pass, more and narrower loads in flight, which often wins
//     at mid-sized row counts), in CTAs of `best`'s threads;
//  5. at `best`'s width and CTA threads, threads per row doubled, then halved;
//  6. at `best`'s width, threads per row and CTA threads doubled together, then halved (as
//     many rows a CTA), in each of `row_forms` alone (Family::row_forms), then in each extra
//     alone that no config of `best`'s shape in `pool` carries (the space rules it out there);
//  7. at the narrower width again, step 4's split in CTAs of as many rows as `best`'s, then
//     `best`'s own shape;
//  8. the rest of order_around(best, pool).
// Each shape of 3-5 and 7 comes with all its extras, as in 1.
// Narrower widths than that one seldom win for memory-bound kernels, so they are left to 8.
std::vector<Config> refine_around(const Config& best, const std::vector<Config>& pool,
                                  const std::vector<Config>& measured,
                                  std::span<const std::string_view> row_forms = {});

}  // namespace kiln
