// How every bench gets its API token: sign in as the first admin the bench server made, over HTTP as the console
// does, and make a token the way an operator does (createApiToken), so the bench measures a real credential.

export async function benchToken(
  base: string,
  o: { password?: string; role?: 'ADMIN' | 'OPERATOR' | 'VIEWER'; callerOnly?: boolean } = {},
): Promise<string> {
  const signIn = await fetch(`${base}/graphql`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      query:
        'mutation($p: String!) { login(email: "admin@hangar.local", password: $p) { ... on LoginPayload { csrfToken } } }',
      variables: { p: o.password ?? 'correct-horse-battery' },
    }),
  });
  const cookie = signIn.headers
    .getSetCookie()
    .map((c) => c.split(';')[0])
    .join('; ');
  const csrf = ((await signIn.json()) as { data: { login: { csrfToken: string } } }).data.login.csrfToken;
  const made = await fetch(`${base}/graphql`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', cookie, 'x-hangar-csrf': csrf },
    body: JSON.stringify({
      query:
        'mutation($role: Role!, $callerOnly: Boolean) { createApiToken(input: {name: "bench", role: $role, callerOnly: $callerOnly}) { ... on CreatedApiToken { secret } } }',
      variables: { role: o.role ?? 'VIEWER', callerOnly: o.callerOnly ?? false },
    }),
  });
  const answer = (await made.json()) as { data?: { createApiToken?: { secret?: string } }; errors?: unknown };
  const secret = answer.data?.createApiToken?.secret;
  if (!secret) throw new Error(`the bench could not make its API token: ${JSON.stringify(answer)}`);
  return secret;
}
