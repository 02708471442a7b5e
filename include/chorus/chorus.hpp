// SPDX-License-Identifier: Apache-2.0
// The umbrella header of the chorus core: communicator, collectives, types, errors.
#pragma once

#include "chorus/collectives.hpp"
#include "chorus/communicator.hpp"
#include "chorus/concepts.hpp"
#include "chorus/error.hpp"
#include "chorus/types.hpp"
