import { useState } from 'react';
import { type AnyVariables, type DocumentInput, useMutation } from 'urql';
import { isRefusal, type Refusal } from '../../graphql/types';

/**
 * A mutation whose answer is a result union, as every Hangar mutation's is: `run` clears the last refusal, sends,
 * keeps a refusal to show (FormError), and gives back the success, or nothing when refused or not sent. `answerOf`
 * picks the mutation's one field from the answer. A transport error is `error`, as urql reports it.
 */
export function useRefusableMutation<Data, Variables extends AnyVariables, Answer extends { __typename: string }>(
  document: DocumentInput<Data, Variables>,
  answerOf: (data: Data) => Answer | null | undefined,
) {
  const [{ fetching, error }, execute] = useMutation(document);
  const [refusal, setRefusal] = useState<Refusal | null>(null);
  const run = async (variables: Variables) => {
    setRefusal(null);
    const result = await execute(variables);
    const answer = result.data ? answerOf(result.data) : undefined;
    if (isRefusal(answer)) {
      // isRefusal checked the typename against the schema's refusals; a generic Answer cannot show TypeScript that.
      setRefusal(answer as unknown as Refusal);
      return undefined;
    }
    return answer ?? undefined;
  };
  return { fetching, error, refusal, run, clearRefusal: () => setRefusal(null) };
}
