// node --test: the node placement read from ONNX Runtime's verbose log.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { describePlacement, parsePlacement } from '../src/placement.mjs';

const at = '2026-11-28 17:10:51.6 [V:onnxruntime:, session_state.cc:1385 VerifyEachNodeIsAssignedToAnEp]';

test('each provider gets its node count and op types', () => {
  const lines = [
    `${at.replace('1385', '1377')} Node placements`,
    `${at.replace('1385', '1383')}  Node(s) placed on [WebGpuExecutionProvider]. Number of nodes: 3`,
    `${at}   Gemm (fc1)`,
    `${at}   Relu (relu1)`,
    `${at}   Gemm (fc1_Grad/Gemm_0)`,
    '2026-11-28 17:10:51.6 [I:onnxruntime:, graph.cc:1 Other] Gemm (not a placement)',
    `${at.replace('1385', '1383')}  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 1`,
    `${at}   LogSoftmax (LogSoftmax_0)`,
  ];
  const placement = parsePlacement(lines);
  assert.deepEqual(placement, {
    WebGpuExecutionProvider: { nodes: 3, ops: { Gemm: 2, Relu: 1 } },
    CPUExecutionProvider: { nodes: 1, ops: { LogSoftmax: 1 } },
  });
  assert.deepEqual(describePlacement(placement), ['WebGpuExecutionProvider 3 nodes (Gemm 2, Relu 1)', 'CPUExecutionProvider 1 nodes (LogSoftmax 1)']);
});

test('all nodes on one provider: the count, no op types', () => {
  const placement = parsePlacement([`${at.replace('1385', '1380')}  All nodes placed on [CPUExecutionProvider]. Number of nodes: 140`]);
  assert.deepEqual(placement, { CPUExecutionProvider: { nodes: 140, ops: null } });
});

test('a log without placement says how to get one', () => {
  assert.throws(() => parsePlacement(['nothing here']), /logSeverityLevel: 0/);
});
