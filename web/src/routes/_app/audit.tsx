import { createFileRoute } from '@tanstack/react-router';
import { AuditLog } from '../../components/audit/audit-log';

export const Route = createFileRoute('/_app/audit')({
  component: AuditLog,
});
