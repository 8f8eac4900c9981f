// node --test: the numbers the demo page shows (steps/s) and the schedule its controls set.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { schedule, stepsPerSecond } from '../demo/plot.mjs';

test('steps/s is a finite number, or null while no time was measured (paused or virtual clock)', () => {
  assert.equal(stepsPerSecond(10, 0), null);
  assert.equal(stepsPerSecond(0, 0), null);
  assert.equal(stepsPerSecond(10, -1), null);
  assert.equal(stepsPerSecond(10, 500), 20);
  assert.equal(stepsPerSecond(0, 500), 0);
});

test("the plan's schedule is kept as is, stretched to other epochs and scaled to another peak", () => {
  const plan = Float64Array.of(0.1, 0.2, 0.3, 0.4);
  assert.equal(schedule(plan, 4, 1), plan);
  assert.deepEqual([...schedule(plan, 8, 1)], [0.1, 0.1, 0.2, 0.2, 0.3, 0.3, 0.4, 0.4]);
  assert.deepEqual([...schedule(plan, 2, 10)], [1, 3]);
});
