import { createFileRoute } from '@tanstack/react-router';
import { auditSearch } from '../../components/audit/audit-filter';
import { AuditLog } from '../../components/audit/audit-log';

// ?actor=…&action=…&target=…&outcome=…&from=…&to=…: a search of the log survives a reload or a shared link.
export const Route = createFileRoute('/_app/audit')({
  validateSearch: auditSearch,
  component: AuditRoute,
});

function AuditRoute() {
  const search = Route.useSearch();
  const navigate = Route.useNavigate();
  return <AuditLog search={search} onSearch={(next) => navigate({ search: next })} />;
}
