// Where ONNX Runtime runs each node of a session: read from its own log.
//
// Neither onnxruntime-web nor onnxruntime-node 1.30 has an API that returns the node-to-provider
// assignment. ONNX Runtime logs it, at VERBOSE severity, when a session is created
// (session_state.cc, VerifyEachNodeIsAssignedToAnEp), after graph optimization and partitioning:
//
//   Node placements
//    Node(s) placed on [WebGpuExecutionProvider]. Number of nodes: 149
//     Gemm (fc1)
//     ...
//    Node(s) placed on [CPUExecutionProvider]. Number of nodes: 11
//     LogSoftmax (LogSoftmax_0)
//
// or, when one provider takes everything, ` All nodes placed on [CPUExecutionProvider]. Number of
// nodes: 140` without the list. So the counts are those of the optimized graph ONNX Runtime runs
// (fused nodes counted once), not of the model file. The entry points open a throwaway session of
// the step model with `logSeverityLevel: 0` and hand its log lines to `parsePlacement`.

/**
 * What runs where: per provider, the node count and (when ONNX Runtime lists them) the count per op type.
 * @typedef {object} ProviderPlacement
 * @property {number} nodes  nodes of the optimized graph assigned to the provider
 * @property {Record<string, number> | null} ops  nodes per op type; null when ONNX Runtime did not list them
 *   (all nodes on one provider)
 */

/** @typedef {Record<string, ProviderPlacement>} Placement  by provider name, e.g. `WebGpuExecutionProvider` */

const HEADER = /(All nodes|Node\(s\)) placed on \[([^\]]+)\]\. Number of nodes: (\d+)/;
const NODE = /VerifyEachNodeIsAssignedToAnEp\]\s{3}(\S+) \(/;

/**
 * The placement ONNX Runtime logged while creating a session.
 * @param {Iterable<string>} lines  log lines (anything else among them is ignored)
 * @returns {Placement}
 * @throws {Error} when the lines hold no placement (the session was not created with `logSeverityLevel: 0`)
 */
export function parsePlacement(lines) {
  /** @type {Placement} */
  const placement = {};
  /** @type {ProviderPlacement | null} */
  let current = null;
  for (const line of lines) {
    const header = HEADER.exec(line);
    if (header) {
      current = { nodes: Number(header[3]), ops: header[1] === 'All nodes' ? null : {} };
      placement[header[2]] = current;
      continue;
    }
    const node = NODE.exec(line);
    if (node && current?.ops) current.ops[node[1]] = (current.ops[node[1]] ?? 0) + 1;
  }
  if (!Object.keys(placement).length) {
    throw new Error("no node placement in ONNX Runtime's log: the session must be created with logSeverityLevel: 0");
  }
  return placement;
}

/**
 * One line per provider: `WebGpuExecutionProvider 149 nodes (Gemm 6, Mul 20, ...)`.
 * @param {Placement} placement
 * @returns {string[]}
 */
export function describePlacement(placement) {
  return Object.entries(placement).map(([provider, { nodes, ops }]) => {
    const kinds = ops ? Object.entries(ops).sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0])).map(([op, n]) => `${op} ${n}`) : [];
    return `${provider} ${nodes} nodes${kinds.length ? ` (${kinds.join(', ')})` : ''}`;
  });
}
