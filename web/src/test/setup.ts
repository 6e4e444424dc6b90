import '@testing-library/jest-dom/vitest';
import { cleanup, configure } from '@testing-library/react';
import { afterEach } from 'vitest';

// findBy… and waitFor give up after this long. The default second is too short on two busy cores (CI, or this
// suite beside the server's), where a render with a few awaited fetches has been seen to take longer.
configure({ asyncUtilTimeout: 5000 });

afterEach(() => cleanup());
