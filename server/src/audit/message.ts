/**
 * A state with its reason, for an audit message or an event: "stopped: no longer assigned to this node". Agents
 * and trainers often write the state into the reason already ("stopped: the node agent was shut down"); saying
 * it twice ("stopped: stopped: …") reads like two events, so a reason that starts with the state word is kept
 * as it is.
 */
export function withState(state: string, reason?: string | null): string {
  const word = state.toLowerCase();
  const said = reason?.trim();
  if (!said) return word;
  return said.toLowerCase().startsWith(word) ? said : `${word}: ${said}`;
}
