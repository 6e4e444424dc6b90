import { useRef, useState } from 'react';
import { graphql, type VariablesOf } from '../../graphql/graphql';
import { CheckField, Field } from '../common/field';
import { FormError, FormError_RefusalFragment, refusedField } from '../common/form-error';
import { onFormSubmit, SubmitButton } from '../common/form-parts';
import { useRefusableMutation } from '../common/use-refusable-mutation';
import { useMirrorListingUpdates } from './mirror-updates';
import { VersionRow_VersionFragment } from './version-row';

export type MirrorSourceInput = VariablesOf<typeof FetchForm_FetchMutation>['sources'][number];

/** The answer to any fetch into the mirror (by URL here, or a registry set): the message and the whole version. */
export const FetchForm_StartedFragment = graphql(
  `
  fragment FetchForm_Started on FetchStarted {
    message
    started
    alreadyArriving
    alreadyPresent
    version {
      ...VersionRow_Version
    }
  }
`,
  [VersionRow_VersionFragment],
);

export const FetchForm_FetchMutation = graphql(
  `
  mutation FetchForm_Fetch(
    $model: String!
    $version: String!
    $sources: [MirrorSourceInput!]!
    $force: Boolean
    $fetchAnyway: Boolean
  ) {
    fetchToMirror(model: $model, version: $version, sources: $sources, force: $force, fetchAnyway: $fetchAnyway) {
      __typename
      ...FetchForm_Started
      ...FormError_Refusal
      ... on UnloadableError {
        field
        file
        reason
      }
    }
  }
`,
  [FetchForm_StartedFragment, FormError_RefusalFragment],
);

type Line = { key: number; url: string; file: string; sha256: string };
type LinePart = 'url' | 'file' | 'sha256';

/**
 * Fetches files by URL into one model version. The answer is the server's own ("started fetching 3 files into
 * m/v"): the bytes are still moving, so nothing here says "added". A refusal is shown next to the field it names.
 * The server reads each GGUF's header first; what the nodes cannot load comes back as a verdict, and taking it
 * regardless is a separate, labelled choice ("Fetch anyway"), never the same button pressed twice.
 */
export function FetchForm({ titleId }: { titleId: string }) {
  const { fetching, error, refusal, run, clearRefusal } = useRefusableMutation(
    FetchForm_FetchMutation,
    (d) => d.fetchToMirror,
  );
  const listing = useMirrorListingUpdates();
  const nextKey = useRef(1);
  const blank = (): Line => ({ key: nextKey.current++, url: '', file: '', sha256: '' });
  const [model, setModel] = useState('');
  const [version, setVersion] = useState('');
  const [lines, setLines] = useState<Line[]>(() => [{ key: 0, url: '', file: '', sha256: '' }]);
  const [force, setForce] = useState(false);
  const [anyway, setAnyway] = useState(false);
  // Which line each submitted source came from: the server names sources by their index in what was sent.
  const [sentKeys, setSentKeys] = useState<number[]>([]);
  const [started, setStarted] = useState<string>();

  // The last answer is about the last fetch: once the operator writes the next one, it goes.
  const edited = () => setStarted(undefined);
  const setLine = (key: number, part: LinePart, value: string) => {
    edited();
    // The verdict was about those URLs: another file is looked at afresh, and "anyway" is chosen again for it.
    if (part === 'url' && refusal?.__typename === 'UnloadableError') {
      clearRefusal();
      setAnyway(false);
    }
    setLines((ls) => ls.map((l) => (l.key === key ? { ...l, [part]: value } : l)));
  };

  const submit = onFormSubmit(async () => {
    setStarted(undefined);
    // Lines left entirely empty (an "Add another file" not used) are not sent; a lone empty line is, to be refused.
    const filled = lines.filter((l) => l.url.trim() || l.file.trim() || l.sha256.trim());
    const sent = filled.length ? filled : lines.slice(0, 1);
    setSentKeys(sent.map((l) => l.key));
    const outcome = await run({
      model: model.trim(),
      version: version.trim(),
      sources: sent.map((l) => ({ url: l.url.trim(), file: l.file.trim() || null, sha256: l.sha256.trim() || null })),
      force,
      fetchAnyway: anyway,
    });
    if (outcome?.__typename === 'FetchStarted') {
      // The listing shows the version now (reading itself again when it is new), not on the first event.
      listing.put(outcome.version);
      setStarted(outcome.message);
      setModel('');
      setVersion('');
      setLines([blank()]);
      setForce(false);
      setAnyway(false);
    }
  });

  // A ValidationError names its field ("model", "sources.0.url"); that field shows the message, word for word.
  const field = refusedField(refusal);
  const errorAt = (name: string) => (field === name ? refusal?.message : undefined);
  const source = field?.match(/^sources\.(\d+)(?:\.(\w+))?$/);
  const sourceLine = source ? sentKeys[Number(source[1])] : undefined;
  const sourcePart = source?.[2] === 'file' || source?.[2] === 'sha256' ? source[2] : 'url';
  const lineError = (key: number, part: LinePart) =>
    sourceLine === key && sourcePart === part ? refusal?.message : undefined;
  const placed = field === 'model' || field === 'version' || field === 'sources' || sourceLine !== undefined;
  const unloadable = refusal?.__typename === 'UnloadableError' ? refusal : null;

  return (
    <form className="fetch-form" aria-labelledby={titleId} onSubmit={submit} noValidate>
      <div className="form-row">
        <Field
          label="Model"
          value={model}
          onChange={(e) => {
            edited();
            setModel(e.target.value);
          }}
          error={errorAt('model')}
          placeholder="qwen3-8b"
          required
        />
        <Field
          label="Version"
          value={version}
          onChange={(e) => {
            edited();
            setVersion(e.target.value);
          }}
          error={errorAt('version')}
          placeholder="Q4_K_M or a commit"
          required
        />
      </div>
      <div className="source-lines">
        {lines.map((line, i) => (
          <fieldset key={line.key} className="source-line">
            <legend className="visually-hidden">File {i + 1}</legend>
            <Field
              label="Source URL"
              className="grow"
              value={line.url}
              onChange={(e) => setLine(line.key, 'url', e.target.value)}
              error={lineError(line.key, 'url')}
              placeholder="https://huggingface.co/Qwen/Qwen3-8B-GGUF/resolve/main/Qwen3-8B-Q4_K_M.gguf"
              inputMode="url"
              spellCheck={false}
              required={i === 0}
            />
            <Field
              label="File name"
              value={line.file}
              onChange={(e) => setLine(line.key, 'file', e.target.value)}
              error={lineError(line.key, 'file')}
              placeholder="from the URL"
            />
            <Field
              label="sha256"
              className="sha"
              value={line.sha256}
              onChange={(e) => setLine(line.key, 'sha256', e.target.value)}
              error={lineError(line.key, 'sha256')}
              placeholder="published by the upstream"
              spellCheck={false}
            />
            {lines.length > 1 ? (
              <button
                type="button"
                className="button small remove-line"
                aria-label={`Remove file ${i + 1} from the form`}
                onClick={() => setLines((ls) => ls.filter((l) => l.key !== line.key))}
              >
                ×
              </button>
            ) : null}
          </fieldset>
        ))}
        {field === 'sources' ? (
          <p role="alert" className="form-error">
            {refusal?.message}
          </p>
        ) : null}
      </div>
      <div className="form-row">
        <button type="button" className="button small" onClick={() => setLines((ls) => [...ls, blank()])}>
          Add another file
        </button>
        <CheckField label="Fetch again files already present" checked={force} onChange={setForce} />
      </div>
      <p className="hint">
        The file name defaults to the URL's last part. Without a sha256, the digest the upstream publishes (the Hub's
        X-Linked-Etag) is checked; a file with neither is kept, marked unverified.
      </p>
      {unloadable ? (
        <div className="header-verdict" role="alert">
          <p className="verdict no">
            <strong>Not fetched: {unloadable.file} cannot be served here.</strong> {unloadable.reason}.
          </p>
          <p className="hint">
            Read from its header before any download. Fetch it anyway if the nodes will be upgraded, or to keep the file
            for something other than serving.
          </p>
          <CheckField
            className="anyway-choice"
            label="Fetch anyway, although the nodes cannot load it"
            checked={anyway}
            onChange={setAnyway}
          />
        </div>
      ) : null}
      <div className="form-row">
        <SubmitButton busy={fetching} className={`button ${anyway ? 'danger' : 'primary'}`}>
          {anyway ? 'Fetch anyway' : 'Start fetching'}
        </SubmitButton>
      </div>
      <FormError refusal={placed || unloadable ? null : refusal} error={error} />
      {started ? (
        <p role="status" className="notice">
          {started}
        </p>
      ) : null}
    </form>
  );
}
